package omni

import (
	"bytes"
	"encoding/json"
	"time"
)

// Timestamp formats t as an envelope timestamp.
func Timestamp(t time.Time) string { return t.UTC().Format(TimeLayout) }

func stamp() string { return Timestamp(time.Now()) }

// Model wraps p in a model_msg envelope stamped now. A complete message
// without a stop reason gets "completed": the original writes stop_reason
// on every complete record (and counts a tool_call as committed only with
// it), so Floe does too.
func Model(p Payload) Message {
	p.markContent()
	if p.StopReason == "" && CompleteType(p.Type) == "" {
		p.StopReason = StatusCompleted
	}
	return Message{Timestamp: stamp(), Type: KindModel, Payload: p}
}

// Event wraps p in an event_msg envelope stamped now.
func Event(p Payload) Message { return Message{Timestamp: stamp(), Type: KindEvent, Payload: p} }

// Text builds a complete text message.
func Text(role, text string) Message {
	return Model(Payload{Type: TypeText, Role: role, Text: text})
}

// UserText builds the user's text message (a Prompt or steering input).
func UserText(text string) Message { return Text(RoleUser, text) }

// Thinking builds a complete thinking message.
func Thinking(thinking string) Message {
	return Model(Payload{Type: TypeThinking, Role: RoleAssistant, Thinking: thinking})
}

// ToolCall builds a complete tool_call; arguments is JSON text.
func ToolCall(name, arguments, toolCallID string) Message {
	return Model(Payload{Type: TypeToolCall, Role: RoleAssistant, Name: name, Arguments: arguments, ToolCallID: toolCallID})
}

// ToolCallOutput builds a complete tool_call_output. stopReason is empty
// (written as completed) for a successful tool, else failed or aborted.
func ToolCallOutput(toolCallID, output, stopReason string) Message {
	return Model(Payload{Type: TypeToolCallOutput, Role: RoleUser, Output: output, ToolCallID: toolCallID, StopReason: stopReason})
}

// Partial builds one fragment of a segment. typ is the complete type
// (text, thinking, tool_call, tool_call_output); content is the fragment's
// text; name and toolCallID identify tool segments.
func Partial(typ, eventType, content, name, toolCallID string) Message {
	p := Payload{Type: PartialType(typ), EventType: eventType, Name: name, ToolCallID: toolCallID}
	p.Role = RoleAssistant
	if typ == TypeToolCallOutput {
		p.Role = RoleUser
		p.Name = ""
	}
	p.SetContent(content)
	p.markContent()
	return Model(p)
}

// markContent marks the streamed content field present, so an empty
// fragment or output still carries it.
func (p *Payload) markContent() {
	var f string
	switch p.Type {
	case TypeText, TypePartialText:
		f = "text"
	case TypeThinking, TypePartialThinking:
		f = "thinking"
	case TypeToolCall, TypePartialToolCall:
		f = "arguments"
	case TypeToolCallOutput, TypePartialToolCallOutput:
		f = "output"
	default:
		return
	}
	p.present |= 1 << uint(fieldIndex[f])
}

// Meta holds the fields of a session_meta payload.
type Meta struct {
	SessionID          string
	Provider           string
	ModelID            string
	ModelContextWindow int64 // 0 or less: not known, written as "unknown"
	SystemPrompt       string
	Workspace          string
	Source             string // "subagent" for a child Session
	AgentState         string
}

// SessionMeta builds a session_meta envelope.
func SessionMeta(m Meta) Message {
	p := Payload{SessionID: m.SessionID, Provider: m.Provider, ModelID: m.ModelID,
		ModelContextWindow: m.ModelContextWindow, SystemPrompt: m.SystemPrompt,
		Workspace: m.Workspace, Source: m.Source, AgentState: m.AgentState}
	if p.ModelContextWindow <= 0 {
		p.ModelContextWindow, p.ContextWindowUnknown = 0, true
	}
	for _, f := range []string{"session_id", "provider", "model_id", "model_context_window", "system_prompt", "workspace", "agent_state"} {
		p.present |= 1 << uint(fieldIndex[f])
	}
	return Message{Timestamp: stamp(), Type: KindSessionMeta, Payload: p}
}

// Meta returns the session_meta fields of p.
func (p *Payload) Meta() Meta {
	return Meta{SessionID: p.SessionID, Provider: p.Provider, ModelID: p.ModelID,
		ModelContextWindow: p.ModelContextWindow, SystemPrompt: p.SystemPrompt,
		Workspace: p.Workspace, Source: p.Source, AgentState: p.AgentState}
}

// ToolListReady builds a tool_list_ready event. The tools are written as
// JSON.stringify would: no HTML escaping, each parameters schema compacted
// (null when empty). A schema that is not valid JSON is kept as it is, so
// that Marshal reports it instead of the tools silently disappearing.
func ToolListReady(specs []ToolSpec) Message {
	raw := []byte{'['}
	for i := range specs {
		s := &specs[i]
		if i > 0 {
			raw = append(raw, ',')
		}
		raw = append(raw, `{"name":`...)
		raw = appendString(raw, s.Name)
		raw = append(raw, `,"description":`...)
		raw = appendString(raw, s.Description)
		raw = append(raw, `,"parameters":`...)
		raw = appendCompact(raw, s.Parameters)
		raw = append(raw, '}')
	}
	raw = append(raw, ']')
	return Event(Payload{Type: TypeToolListReady, Tools: raw})
}

// appendCompact appends the JSON value r without insignificant whitespace,
// null if r is empty, and r unchanged if it is not valid JSON.
func appendCompact(dst, r []byte) []byte {
	if len(r) == 0 {
		return append(dst, "null"...)
	}
	var buf bytes.Buffer
	if json.Compact(&buf, r) != nil {
		return append(dst, r...)
	}
	return append(dst, buf.Bytes()...)
}

// RequestBegin builds a request_begin event.
func RequestBegin() Message { return Event(Payload{Type: TypeRequestBegin}) }

// RequestEnd builds a request_end event. attempt and retryInMs are omitted
// when zero.
func RequestEnd(status, errorMessage string, attempt, retryInMs int64) Message {
	return Event(Payload{Type: TypeRequestEnd, Status: status, ErrorMessage: errorMessage, Attempt: attempt, RetryInMs: retryInMs})
}

// ApprovalDecision builds an approval_decision event.
func ApprovalDecision(decision, toolCallID string) Message {
	return Event(Payload{Type: TypeApprovalDecision, Decision: decision, ToolCallID: toolCallID})
}

// TokenUsage builds a token_usage event: session is the Session's cumulative
// usage, request this request's.
func TokenUsage(session, request Usage) Message {
	return Event(Payload{Type: TypeTokenUsage, Session: &session, Request: &request})
}

// CompactionBegin builds a compaction_begin event.
func CompactionBegin(reason, mode string, context, turns int64) Message {
	p := Payload{Type: TypeCompactionBegin, Reason: reason, Mode: mode, Context: context, Turns: turns}
	p.present |= 1<<uint(fieldIndex["context"]) | 1<<uint(fieldIndex["turns"])
	return Event(p)
}

// CompactionEnd builds a compaction_end event.
func CompactionEnd(reason, mode, status string) Message {
	return Event(Payload{Type: TypeCompactionEnd, Reason: reason, Mode: mode, Status: status})
}

// Abort builds an abort event.
func Abort(reason string) Message { return Event(Payload{Type: TypeAbort, Reason: reason}) }

// Subagent builds the parent's pointer event to a child Session.
func Subagent(childSessionID string) Message {
	return Event(Payload{Type: TypeSubagent, SessionID: childSessionID})
}

// WithOrigin returns a copy of m forwarded one level up: childSessionID is
// prepended to its origin chain.
func (m Message) WithOrigin(childSessionID string) Message {
	o := make([]string, 0, len(m.Origin)+1)
	m.Origin = append(append(o, childSessionID), m.Origin...)
	return m
}
