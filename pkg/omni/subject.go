package omni

import "strings"

// Stream and bucket names of the bus (protocol.md §2).
const (
	// SessionsStream holds every Session subject; its sequence is the
	// stream order.
	SessionsStream = "FLOE_SESSIONS"
	// SessionSubjects is the subject filter of SessionsStream.
	SessionSubjects = "floe.session.*.*"
)

// Subject classes: the last token of floe.session.<sid>.<class>.
const (
	ClassMeta    = "meta"
	ClassPartial = "partial"
	ClassModel   = "model"
	ClassEvent   = "event"
	ClassNested  = "nested"
	ClassServer  = "server"
	ClassTrace   = "trace"
)

// SessionSubject returns floe.session.<sid>.<class>.
func SessionSubject(sessionID, class string) string {
	return "floe.session." + sessionID + "." + class
}

// SessionWildcard returns floe.session.<sid>.* (every class of a Session).
func SessionWildcard(sessionID string) string { return "floe.session." + sessionID + ".*" }

// ClientClasses are the classes of a Session's client stream, and
// TraceClasses those its Trace records (protocol.md §2).
var (
	ClientClasses = []string{ClassPartial, ClassModel, ClassEvent, ClassNested, ClassServer}
	TraceClasses  = []string{ClassMeta, ClassModel, ClassEvent, ClassTrace}
)

// ClassOf returns the subject class a message is published on.
func ClassOf(m *Message) string {
	switch {
	case len(m.Origin) > 0:
		return ClassNested
	case m.Type == KindSessionMeta:
		return ClassMeta
	case m.Type == KindEvent:
		return ClassEvent
	case IsPartialType(m.Payload.Type):
		return ClassPartial
	default:
		return ClassModel
	}
}

// ParseSessionSubject splits floe.session.<sid>.<class>; ok is false for any
// other subject, including one with more tokens (a Session id has no dots).
func ParseSessionSubject(subject string) (sessionID, class string, ok bool) {
	rest, found := strings.CutPrefix(subject, "floe.session.")
	if !found {
		return "", "", false
	}
	sessionID, class, found = strings.Cut(rest, ".")
	if !found || sessionID == "" || class == "" || strings.IndexByte(class, '.') >= 0 {
		return "", "", false
	}
	return sessionID, class, true
}

// ValidSessionID reports whether id can be used as a subject token: non-empty,
// no dots, wildcards or whitespace.
func ValidSessionID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if c == '.' || c == '*' || c == '>' || c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// HookSubject returns floe.hook.<point>: the subject a NATS hook service
// answers requests on (protocol.md §7 "Hooks").
func HookSubject(point string) string { return "floe.hook." + point }
