package bus

// PolicyLag and PolicyKeyPrefix for the external tests.
const (
	PolicyLag       = policyLag
	PolicyKeyPrefix = policyKeyPrefix
)
