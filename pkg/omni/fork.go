package omni

import "encoding/json"

// ForkedFrom names where a forked Session was cut from its parent: the
// parent's id and the stream sequence its history was taken up to
// (protocol.md §3, the fork route). Its JSON form is the forked_from field of
// the fork's session_meta, an extra field the original harness ignores.
type ForkedFrom struct {
	SessionID string `json:"session_id" msgpack:"session_id"`
	Seq       uint64 `json:"seq" msgpack:"seq"`
	// Record is the parent's record ordinal the history was taken up to,
	// for a fork cut by record (Seq is then that record's sequence, 0 when
	// it was read from a Trace file).
	Record *int `json:"record,omitempty" msgpack:"record,omitempty"`
}

// ForkMeta builds the head of a forked Session's Trace: a session_meta
// with the known fields of meta (the parent's context head), the fork's
// own session id, and forked_from. A forked_from the parent's head carried
// (a fork of a fork) is not kept: the new one replaces it.
func ForkMeta(meta *Message, sessionID string, from ForkedFrom) Message {
	m := meta.Payload.Meta()
	m.SessionID = sessionID
	out := SessionMeta(m)
	out.Payload = withExtra(out.Payload, "forked_from", from)
	return out
}

// ForkedFrom returns the forked_from field of a session_meta payload; ok
// is false when it has none or it does not decode.
func (p *Payload) ForkedFrom() (f ForkedFrom, ok bool) {
	raw := p.Field("forked_from")
	if raw == nil || json.Unmarshal(raw, &f) != nil || f.SessionID == "" {
		return ForkedFrom{}, false
	}
	return f, true
}
