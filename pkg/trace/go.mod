module floe.dev/pkg/trace

go 1.26.0

require (
	floe.dev/pkg/bus v0.0.0
	floe.dev/pkg/omni v0.0.0
	github.com/nats-io/nats.go v1.55.0
)

replace floe.dev/pkg/omni => ../omni

replace floe.dev/pkg/bus => ../bus
