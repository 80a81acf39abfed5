package omni

import (
	"regexp"
	"time"
)

var sessionIDRe = regexp.MustCompile(`^session-(\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2})-[0-9a-f]{8}$`)

// SessionCreated returns the creation time encoded in a Session id of the
// form session-YYYY-MM-DD-HH-mm-ss-<8hex>.
func SessionCreated(sessionID string) (time.Time, bool) {
	m := sessionIDRe.FindStringSubmatch(sessionID)
	if m == nil {
		return time.Time{}, false
	}
	t, err := time.Parse("2006-01-02-15-04-05", m[1])
	return t, err == nil
}

// NewSessionID returns a Session id for a Session created at t; rand8 is
// eight lower-case hex digits.
func NewSessionID(t time.Time, rand8 string) string {
	return "session-" + t.UTC().Format("2006-01-02-15-04-05") + "-" + rand8
}
