package trace

import (
	"bytes"

	"floe.dev/pkg/omni"
)

// A cut must know what a history leaves open (openState), and that depends
// on a few records only: tool calls, their outputs, request and compaction
// brackets, aborts, subagent pointers and heads. Decoding every record to
// find them made a fork cost a resume. peek reads what the open state needs
// straight from a record's bytes when the record is in the shape Floe's
// encoder writes (omni.Message.AppendJSON: timestamp, type, payload with
// its type first, origin last); any other record is decoded, so the result
// is the fold's either way.

// peekKind says what peek made of a record.
type peekKind uint8

const (
	// peekDecode: not in the encoder's shape, or a record whose fields the
	// open state needs and peek does not read (events, heads): decode it.
	peekDecode peekKind = iota
	// peekInert: a record the open state ignores (text, thinking,
	// approvals, usage, partials, …), whatever its origin.
	peekInert
	// peekCall: a top-level tool_call; id, name and stop are set.
	peekCall
	// peekOutput: a top-level tool_call_output; id is set.
	peekOutput
	// peekBegin: a top-level request_begin without other fields.
	peekBegin
)

// peeked is what peek read of a record.
type peeked struct {
	kind           peekKind
	id, name, stop string
}

var (
	prefixTimestamp = []byte(`{"timestamp":"`)
	sepType         = []byte(`,"type":"`)
	sepPayload      = []byte(`,"payload":{"type":"`)
	sepRoleUser     = []byte(`,"role":"user"`)
	sepRoleAsst     = []byte(`,"role":"assistant"`)
	sepName         = []byte(`,"name":"`)
	keyToolCallID   = []byte(`"tool_call_id":"`)
	sepStopReason   = []byte(`,"stop_reason":"`)
	recordEnd       = []byte(`}}`)
)

// peek classifies a trimmed record line without decoding it.
func peek(line []byte) peeked {
	if !bytes.HasPrefix(line, prefixTimestamp) || !bytes.HasSuffix(line, recordEnd) {
		return peeked{}
	}
	ts, rest, ok := plainString(line[len(prefixTimestamp):])
	if !ok || len(ts) == 0 || !bytes.HasPrefix(rest, sepType) {
		return peeked{}
	}
	kind, rest, ok := plainString(rest[len(sepType):])
	if !ok || !bytes.HasPrefix(rest, sepPayload) {
		return peeked{}
	}
	typ, rest, ok := plainString(rest[len(sepPayload):])
	if !ok {
		return peeked{}
	}
	// rest follows the payload type's closing quote.
	switch string(kind) {
	case string(omni.KindModel):
		switch t := string(typ); t {
		case omni.TypeToolCall:
			if !bytes.HasPrefix(rest, sepRoleAsst) || !bytes.HasPrefix(rest[len(sepRoleAsst):], sepName) {
				return peeked{}
			}
			name, _, ok := plainString(rest[len(sepRoleAsst)+len(sepName):])
			if !ok || len(name) == 0 {
				return peeked{}
			}
			id, stop, ok := peekTail(line)
			if !ok {
				return peeked{}
			}
			return peeked{kind: peekCall, id: id, name: string(name), stop: stop}
		case omni.TypeToolCallOutput:
			if !bytes.HasPrefix(rest, sepRoleUser) && !bytes.HasPrefix(rest, sepRoleAsst) {
				return peeked{}
			}
			id, stop, ok := peekTail(line)
			if !ok {
				return peeked{}
			}
			return peeked{kind: peekOutput, id: id, stop: stop}
		case omni.TypeText, omni.TypeThinking, omni.TypeImageURL, omni.TypeInlineData, omni.TypeInlineThinking:
			return peeked{kind: peekInert}
		default:
			if omni.IsPartialType(t) {
				return peeked{kind: peekInert}
			}
		}
	case string(omni.KindEvent):
		switch string(typ) {
		case omni.TypeRequestBegin:
			if string(rest) == `}}` {
				return peeked{kind: peekBegin}
			}
		case omni.TypeApprovalDecision, omni.TypeTokenUsage, omni.TypeToolListReady,
			omni.TypeMCPConnectBegin, omni.TypeMCPConnectEnd:
			return peeked{kind: peekInert}
		}
	}
	return peeked{}
}

// peekTail reads the end of a tool call or output record as the encoder
// writes it: `"tool_call_id":"<id>"}}` or
// `"tool_call_id":"<id>","stop_reason":"<stop>"}}`, nothing after it (so
// no origin, which is written after the payload). The last occurrence of
// the key is the payload's: a string value holding it has its quotes
// escaped. ok is false for an empty id or an unknown stop_reason (decode
// and validate those).
func peekTail(line []byte) (id, stop string, ok bool) {
	i := bytes.LastIndex(line, keyToolCallID)
	if i < 0 {
		return "", "", false
	}
	idb, rest, ok := plainString(line[i+len(keyToolCallID):])
	if !ok || len(idb) == 0 {
		return "", "", false
	}
	switch {
	case string(rest) == `}}`:
		return string(idb), omni.StatusCompleted, true
	case bytes.HasPrefix(rest, sepStopReason):
		s, tail, ok := plainString(rest[len(sepStopReason):])
		if !ok || string(tail) != `}}` {
			return "", "", false
		}
		switch st := string(s); st {
		case "":
			return string(idb), omni.StatusCompleted, true
		case omni.StatusCompleted, omni.StatusFailed, omni.StatusAborted, omni.StatusTimeout, omni.StatusMalformed,
			omni.StatusAuth, omni.StatusRetryable, omni.StatusFatal:
			return string(idb), st, true
		}
	}
	return "", "", false
}

// plainString reads a JSON string's contents up to its closing quote (b
// starts after the opening one): ok only when it holds no escape (so the
// bytes are the value). rest starts right after the closing quote.
func plainString(b []byte) (s, rest []byte, ok bool) {
	i := bytes.IndexByte(b, '"')
	if i < 0 || bytes.IndexByte(b[:i], '\\') >= 0 {
		return nil, nil, false
	}
	return b[:i], b[i+1:], true
}
