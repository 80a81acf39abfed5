package omni

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("omni: invalid message")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// Validate checks that m is a well-formed OmniMessage: a known envelope and
// payload type, the fields that type requires, and values from the closed
// sets (roles, event types, statuses, decisions).
func (m *Message) Validate() error {
	p := &m.Payload
	if m.Timestamp == "" {
		return invalid("missing timestamp")
	}
	switch m.Type {
	case KindSessionMeta:
		if p.SessionID == "" {
			return invalid("session_meta without session_id")
		}
		return nil
	case KindModel:
		return p.validateModel()
	case KindEvent:
		return p.validateEvent()
	case "":
		return invalid("missing envelope type")
	default:
		return invalid("unknown envelope type %q", m.Type)
	}
}

func (p *Payload) validateModel() error {
	switch p.Type {
	case TypeText, TypeThinking, TypeImageURL, TypeInlineData, TypeInlineThinking:
	case TypeToolCall, TypeToolCallOutput:
		if p.ToolCallID == "" {
			return invalid("%s without tool_call_id", p.Type)
		}
		if p.Type == TypeToolCall && p.Name == "" {
			return invalid("tool_call %s without name", p.ToolCallID)
		}
	case TypePartialText, TypePartialThinking:
		if err := checkEventType(p); err != nil {
			return err
		}
	case TypePartialToolCall, TypePartialToolCallOutput:
		if err := checkEventType(p); err != nil {
			return err
		}
		if p.ToolCallID == "" {
			return invalid("%s without tool_call_id", p.Type)
		}
	case "":
		return invalid("model_msg without payload type")
	default:
		return invalid("unknown model_msg type %q", p.Type)
	}
	if p.Role != RoleUser && p.Role != RoleAssistant {
		return invalid("%s: role %q is not user or assistant", p.Type, p.Role)
	}
	if p.StopReason != "" && !validStatus(p.StopReason) {
		return invalid("%s: unknown stop_reason %q", p.Type, p.StopReason)
	}
	return nil
}

func checkEventType(p *Payload) error {
	switch p.EventType {
	case EventStart, EventDelta, EventStop:
		return nil
	case "":
		return invalid("%s without event_type", p.Type)
	}
	return invalid("%s: bad event_type %q (want start, delta or stop)", p.Type, p.EventType)
}

func validStatus(s string) bool {
	switch s {
	case StatusCompleted, StatusFailed, StatusAborted, StatusTimeout, StatusMalformed, StatusAuth,
		StatusRetryable, StatusFatal:
		return true
	}
	return false
}

func (p *Payload) validateEvent() error {
	switch p.Type {
	case TypeToolListReady:
		if _, err := p.ToolSpecs(); err != nil {
			return invalid("tool_list_ready: tools: %v", err)
		}
	case TypeRequestBegin, TypeAbort, TypeMCPConnectBegin, TypeMCPConnectEnd:
	case TypeRequestEnd:
		if !validStatus(p.Status) {
			return invalid("request_end: unknown status %q", p.Status)
		}
	case TypeApprovalDecision:
		if p.ToolCallID == "" {
			return invalid("approval_decision without tool_call_id")
		}
		switch p.Decision {
		case DecisionAllow, DecisionDeny, DecisionForbidden:
		default:
			return invalid("approval_decision: unknown decision %q", p.Decision)
		}
	case TypeTokenUsage:
		if p.Session == nil || p.Request == nil {
			return invalid("token_usage without session or request counts")
		}
	case TypeCompactionBegin, TypeCompactionEnd:
		switch p.Reason {
		case CompactContext, CompactTurns, CompactManual:
		default:
			return invalid("%s: unknown reason %q", p.Type, p.Reason)
		}
		if p.Mode != ModeSummarize && p.Mode != ModeDiscard {
			return invalid("%s: unknown mode %q", p.Type, p.Mode)
		}
		if p.Type == TypeCompactionEnd && !validStatus(p.Status) {
			return invalid("compaction_end: unknown status %q", p.Status)
		}
	case TypeSubagent:
		if p.SessionID == "" {
			return invalid("subagent without session_id")
		}
	case "":
		return invalid("event_msg without payload type")
	default:
		if knownTypes[p.Type] {
			return invalid("model_msg type %q in an event_msg", p.Type)
		}
		// Event types Floe does not know (the original's goal_finished,
		// …) are kept byte for byte and never fail a read (protocol.md §1).
	}
	return nil
}
