// Package omni is Floe's vocabulary: the OmniMessage envelope and payloads of
// protocol.md §1, their builders and guards, the single-line JSON codec of the public
// stream, the msgpack codec of internal payloads, the bus subject names of
// protocol.md §2 and the error codes that travel on the wire.
//
// It is plain data and pure functions: no NATS, no logging, no clocks except
// in the builders that stamp a timestamp.
package omni

import (
	"encoding/json"
	"strings"
	"time"
)

// Kind is the envelope type.
type Kind string

// Envelope types.
const (
	KindSessionMeta Kind = "session_meta"
	KindModel       Kind = "model_msg"
	KindEvent       Kind = "event_msg"
)

// Payload types of model messages (complete and partial) and events.
const (
	TypeText           = "text"
	TypeThinking       = "thinking"
	TypeToolCall       = "tool_call"
	TypeToolCallOutput = "tool_call_output"
	TypeImageURL       = "image_url"
	TypeInlineData     = "inline_data"
	TypeInlineThinking = "inline_thinking"

	TypePartialText           = "partial_text"
	TypePartialThinking       = "partial_thinking"
	TypePartialToolCall       = "partial_tool_call"
	TypePartialToolCallOutput = "partial_tool_call_output"

	TypeToolListReady    = "tool_list_ready"
	TypeRequestBegin     = "request_begin"
	TypeRequestEnd       = "request_end"
	TypeApprovalDecision = "approval_decision"
	TypeTokenUsage       = "token_usage"
	TypeCompactionBegin  = "compaction_begin"
	TypeCompactionEnd    = "compaction_end"
	TypeAbort            = "abort"
	TypeSubagent         = "subagent"
)

// Roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// Segment event types of partials.
const (
	EventStart = "start"
	EventDelta = "delta"
	EventStop  = "stop"
)

// Stop reasons and request statuses: the vocabulary Floe writes (protocol.md §1).
const (
	StatusCompleted = "completed"
	StatusFailed    = "failed"
	StatusAborted   = "aborted"
	StatusTimeout   = "timeout"
	StatusMalformed = "malformed"
	StatusAuth      = "auth"
)

// The original harness's stop reasons since its 0.2.6 (protocol.md §5): one
// four-value vocabulary, completed, aborted, retryable (worth another
// attempt) and fatal (no retry can fix it). Floe reads them in imported
// Traces and never writes them; readers only ever compare with completed,
// so both vocabularies fold the same way.
const (
	StatusRetryable = "retryable"
	StatusFatal     = "fatal"
)

// Approval decisions.
const (
	DecisionAllow     = "allow"
	DecisionDeny      = "deny"
	DecisionForbidden = "forbidden"
)

// Compaction reasons and modes.
const (
	CompactContext = "context"
	CompactTurns   = "turns"
	CompactManual  = "manual"

	ModeSummarize = "summarize"
	ModeDiscard   = "discard"
)

// Fixed model-visible strings (protocol.md §1).
const (
	DeniedByUser      = "Tool call denied by user."
	DeniedByPolicy    = "Tool call denied by policy."
	NoOutput          = "[no output]"
	InterruptedOutput = "[interrupted: tool aborted by user]"
	// AbortedByUser is the reason of the abort event that ends a run a
	// person interrupted.
	AbortedByUser = "aborted by user"
)

// MaxTurnsNotice is the assistant text that ends a run at max_turns.
func MaxTurnsNotice(n int) string {
	return "[reached max turns (" + itoa(int64(n)) + "); stopping]"
}

// Block wraps text in a system block as the original writes it:
// "[tag]\ntext\n[/tag]".
func Block(tag, text string) string { return "[" + tag + "]\n" + text + "\n[/" + tag + "]" }

// ParseBlock returns the body of s when s is one system block with tag:
// "[tag]\nbody\n[/tag]" (the original's form, Block's) or "[tag]body[/tag]"
// (the older form). Surrounding whitespace is ignored.
func ParseBlock(s, tag string) (body string, ok bool) {
	s = strings.TrimSpace(s)
	open, end := "["+tag+"]", "[/"+tag+"]"
	if len(s) < len(open)+len(end) || !strings.HasPrefix(s, open) || !strings.HasSuffix(s, end) {
		return "", false
	}
	body = s[len(open) : len(s)-len(end)]
	body = strings.TrimPrefix(body, "\n")
	body = strings.TrimSuffix(body, "\n")
	return body, true
}

// System block tags.
const (
	TagTurnRetried    = "turn_retried"
	TagTurnAborted    = "turn_aborted"
	TagUserSteering   = "user_steering"
	TagSummary        = "summary"
	TagContextSummary = "context_summary"
)

// TimeLayout is the envelope timestamp format: ISO-8601 UTC with milliseconds.
const TimeLayout = "2006-01-02T15:04:05.000Z"

// Message is one OmniMessage envelope.
//
// Timestamp is kept as text so that a decoded message re-encodes byte for
// byte: envelope keys keep their decoded order, unknown envelope fields and an
// explicit "origin":null or "origin":[] survive. Origin lists child Session
// ids, outer to inner; empty means the message belongs to the Session whose
// subject carries it.
type Message struct {
	Timestamp string
	Type      Kind
	Payload   Payload
	Origin    []string

	// env holds what decoding must remember to re-encode the envelope byte
	// for byte; nil when the keys came in canonical order, all known,
	// with no null or empty origin (every Floe-written message), which
	// keeps Message small.
	env *envRaw
}

// envRaw is the decoded envelope beyond its fields. It is never changed
// after decoding, so copies of a Message may share it.
type envRaw struct {
	order     []fieldRef // decoded envelope key order: env* or extraBase+i
	extra     []rawField // unknown envelope fields
	originRaw []byte     // a decoded origin that was null or empty, as written
}

// Time parses the timestamp; the zero time if it is not in TimeLayout or RFC 3339.
func (m *Message) Time() time.Time {
	if t, err := time.Parse(TimeLayout, m.Timestamp); err == nil {
		return t
	}
	t, _ := time.Parse(time.RFC3339Nano, m.Timestamp)
	return t
}

// Usage is one set of token counts.
type Usage struct {
	CacheRead  int64 `json:"cache_read" msgpack:"cache_read"`
	CacheWrite int64 `json:"cache_write" msgpack:"cache_write"`
	Output     int64 `json:"output" msgpack:"output"`
	Total      int64 `json:"total" msgpack:"total"`
}

// Add returns u + v.
func (u Usage) Add(v Usage) Usage {
	return Usage{u.CacheRead + v.CacheRead, u.CacheWrite + v.CacheWrite, u.Output + v.Output, u.Total + v.Total}
}

// ToolSpec describes one tool in tool_list_ready and in model requests.
type ToolSpec struct {
	Name        string          `json:"name" msgpack:"name"`
	Description string          `json:"description" msgpack:"description"`
	Parameters  json.RawMessage `json:"parameters" msgpack:"parameters"`
	// Permission is "r" or "rw"; not part of the wire payload.
	Permission string `json:"-" msgpack:"permission"`
	// Source says where the tool comes from: "builtin", "engine" or
	// "mcp:<server>"; not part of the wire payload.
	Source string `json:"-" msgpack:"source,omitempty"`
}

// Payload is the union of every payload of protocol.md §1, flattened: Type says which
// fields are meaningful. A field is encoded when it is non-zero or when it was
// present in the decoded input, so zero values round-trip too; a known field
// decoded as null reads as its zero value and is written as null until it is
// set. Fields appear in the order they were decoded in; fields set later
// follow in canonical order. Unknown fields, and token counts left unchanged,
// survive decode/encode byte for byte.
type Payload struct {
	Type string

	Role       string
	EventType  string
	Name       string
	Arguments  string
	Output     string
	Text       string
	Thinking   string
	Sender     string
	ImageURL   string
	Data       string
	MimeType   string
	ToolCallID string
	Images     json.RawMessage // array, passed through
	StopReason string
	Fidelity   json.RawMessage // opaque object, passed through byte for byte

	// session_meta
	SessionID          string
	Provider           string
	ModelID            string
	ModelContextWindow int64
	// ContextWindowUnknown: model_context_window is (or is written as) the
	// string "unknown", as the original writes it when the model's window
	// is not known; ModelContextWindow is then 0.
	ContextWindowUnknown bool
	SystemPrompt         string
	Workspace            string
	Source               string
	AgentState           string

	// events
	Tools        json.RawMessage // tool_list_ready: [{name,description,parameters}]
	Status       string
	ErrorMessage string
	Attempt      int64
	RetryInMs    int64
	Decision     string
	Session      *Usage
	Request      *Usage
	Reason       string
	Mode         string
	Context      int64
	Turns        int64

	present fieldSet // fields present in decoded input (even when zero); decodedInOrder
	nulls   fieldSet // known fields decoded as null
	// raw holds what decoding must remember beyond present and nulls to
	// re-encode the payload byte for byte; nil for the usual payload (known
	// fields in canonical order, token counts written as Floe writes them).
	raw *payloadRaw
}

// payloadRaw is the decoded payload beyond its fields. It is never changed
// after decoding (mcp.go's withExtra builds a new one), so copies of a
// Payload may share it.
type payloadRaw struct {
	order []fieldRef // decoded field order
	extra []rawField // unknown fields
	usage [2]rawUsage
}

// rawUsage keeps the bytes of a decoded token count object (session,
// request) with the value they decoded to: while the value is unchanged the
// bytes are written back, so key order and unknown counts survive.
type rawUsage struct {
	raw []byte
	val Usage
}

// ToolSpecs decodes the tools of a tool_list_ready payload.
func (p *Payload) ToolSpecs() ([]ToolSpec, error) {
	var specs []ToolSpec
	if len(p.Tools) == 0 {
		return nil, nil
	}
	err := json.Unmarshal(p.Tools, &specs)
	return specs, err
}

// Guards.

// IsSessionMeta reports whether m is a session_meta envelope.
func (m *Message) IsSessionMeta() bool { return m.Type == KindSessionMeta }

// IsEvent reports whether m is an event_msg.
func (m *Message) IsEvent() bool { return m.Type == KindEvent }

// IsPartial reports whether m is a partial_* model message.
func (m *Message) IsPartial() bool { return m.Type == KindModel && IsPartialType(m.Payload.Type) }

// IsComplete reports whether m is a complete model message.
func (m *Message) IsComplete() bool { return m.Type == KindModel && !IsPartialType(m.Payload.Type) }

// IsNested reports whether m was forwarded from a child Session.
func (m *Message) IsNested() bool { return len(m.Origin) > 0 }

// IsPartialType reports whether t is a partial_* payload type.
func IsPartialType(t string) bool {
	switch t {
	case TypePartialText, TypePartialThinking, TypePartialToolCall, TypePartialToolCallOutput:
		return true
	}
	return false
}

// Stop returns p's stop reason, completed when the field is absent: a
// reader treats a missing stop_reason as completed (Traces from before it
// was written on every record).
func (p *Payload) Stop() string {
	if p.StopReason == "" {
		return StatusCompleted
	}
	return p.StopReason
}

// CompleteType maps a partial type to its complete type ("" if t is not a
// partial type).
func CompleteType(t string) string {
	switch t {
	case TypePartialText:
		return TypeText
	case TypePartialThinking:
		return TypeThinking
	case TypePartialToolCall:
		return TypeToolCall
	case TypePartialToolCallOutput:
		return TypeToolCallOutput
	}
	return ""
}

// PartialType maps a complete type to its partial type ("" if none).
func PartialType(t string) string {
	switch t {
	case TypeText:
		return TypePartialText
	case TypeThinking:
		return TypePartialThinking
	case TypeToolCall:
		return TypePartialToolCall
	case TypeToolCallOutput:
		return TypePartialToolCallOutput
	}
	return ""
}

// Content returns the streamed content field of a text, thinking, tool_call
// (arguments) or tool_call_output message, complete or partial.
func (p *Payload) Content() string {
	switch p.Type {
	case TypeText, TypePartialText:
		return p.Text
	case TypeThinking, TypePartialThinking:
		return p.Thinking
	case TypeToolCall, TypePartialToolCall:
		return p.Arguments
	case TypeToolCallOutput, TypePartialToolCallOutput:
		return p.Output
	}
	return ""
}

// SetContent sets the field Content reads.
func (p *Payload) SetContent(s string) {
	switch p.Type {
	case TypeText, TypePartialText:
		p.Text = s
	case TypeThinking, TypePartialThinking:
		p.Thinking = s
	case TypeToolCall, TypePartialToolCall:
		p.Arguments = s
	case TypeToolCallOutput, TypePartialToolCallOutput:
		p.Output = s
	}
}

// ImageURLs reads a tool output's images array leniently: each element is
// a URL or data URL string, or an object with image_url (string or {url}),
// url, or data + mime_type. Elements it cannot read are skipped.
func (p *Payload) ImageURLs() []string {
	raw := p.Images
	if len(raw) == 0 {
		return nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil
	}
	var out []string
	for _, it := range items {
		var s string
		if json.Unmarshal(it, &s) == nil {
			if s != "" {
				out = append(out, s)
			}
			continue
		}
		var o struct {
			ImageURL json.RawMessage `json:"image_url"`
			URL      string          `json:"url"`
			Data     string          `json:"data"`
			MimeType string          `json:"mime_type"`
		}
		if json.Unmarshal(it, &o) != nil {
			continue
		}
		var nested struct {
			URL string `json:"url"`
		}
		switch {
		case json.Unmarshal(o.ImageURL, &s) == nil && s != "":
			out = append(out, s)
		case json.Unmarshal(o.ImageURL, &nested) == nil && nested.URL != "":
			out = append(out, nested.URL)
		case o.URL != "":
			out = append(out, o.URL)
		case o.Data != "" && o.MimeType != "":
			out = append(out, "data:"+o.MimeType+";base64,"+o.Data)
		}
	}
	return out
}
