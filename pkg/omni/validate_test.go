package omni

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestValidateAcceptsEveryBuilderMessage(t *testing.T) {
	for _, tc := range builderMessages() {
		if err := tc.m.Validate(); err != nil {
			t.Errorf("Validate(%s) = %v, want nil", tc.name, err)
		}
	}
}

func TestValidate(t *testing.T) {
	model := func(p Payload) Message { return Message{Timestamp: testStamp, Type: KindModel, Payload: p} }
	event := func(p Payload) Message { return Message{Timestamp: testStamp, Type: KindEvent, Payload: p} }
	u := &Usage{}
	tests := []struct {
		name    string
		m       Message
		wantErr string // "" means valid; else a substring of the error
	}{
		{"text", model(Payload{Type: TypeText, Role: RoleUser, Text: "x"}), ""},
		{"text with stop_reason", model(Payload{Type: TypeText, Role: RoleAssistant, StopReason: StatusFailed}), ""},
		{"image_url", model(Payload{Type: TypeImageURL, Role: RoleUser, ImageURL: "u"}), ""},
		{"inline_data", model(Payload{Type: TypeInlineData, Role: RoleAssistant}), ""},
		{"inline_thinking", model(Payload{Type: TypeInlineThinking, Role: RoleAssistant}), ""},
		{"partial_text delta", model(Payload{Type: TypePartialText, Role: RoleAssistant, EventType: EventDelta}), ""},
		{"partial_tool_call_output stop", model(Payload{Type: TypePartialToolCallOutput, Role: RoleUser, EventType: EventStop, ToolCallID: "c"}), ""},
		{"request_end with every status", event(Payload{Type: TypeRequestEnd, Status: StatusAuth}), ""},
		{"abort without reason", event(Payload{Type: TypeAbort}), ""},
		{"session_meta", Message{Timestamp: testStamp, Type: KindSessionMeta, Payload: Payload{SessionID: "s"}}, ""},

		{"missing timestamp", Message{Type: KindEvent, Payload: Payload{Type: TypeRequestBegin}}, "missing timestamp"},
		{"missing envelope type", Message{Timestamp: testStamp, Payload: Payload{Type: TypeRequestBegin}}, "missing envelope type"},
		{"unknown envelope type", Message{Timestamp: testStamp, Type: "server_msg"}, `unknown envelope type "server_msg"`},
		{"session_meta without session_id", Message{Timestamp: testStamp, Type: KindSessionMeta}, "session_meta without session_id"},
		{"model_msg without payload type", model(Payload{Role: RoleUser}), "model_msg without payload type"},
		{"unknown model payload type", model(Payload{Type: "video", Role: RoleUser}), `unknown model_msg type "video"`},
		{"event type in model_msg", model(Payload{Type: TypeRequestBegin, Role: RoleUser}), `unknown model_msg type "request_begin"`},
		{"event_msg without payload type", event(Payload{}), "event_msg without payload type"},
		{"model type in event_msg", event(Payload{Type: TypeText}), `model_msg type "text" in an event_msg`},
		{"tool_call without tool_call_id", model(Payload{Type: TypeToolCall, Role: RoleAssistant, Name: "exec"}), "tool_call without tool_call_id"},
		{"tool_call without name", model(Payload{Type: TypeToolCall, Role: RoleAssistant, ToolCallID: "c1"}), "tool_call c1 without name"},
		{"tool_call_output without tool_call_id", model(Payload{Type: TypeToolCallOutput, Role: RoleUser}), "tool_call_output without tool_call_id"},
		{"partial_tool_call without tool_call_id", model(Payload{Type: TypePartialToolCall, Role: RoleAssistant, EventType: EventStart}), "partial_tool_call without tool_call_id"},
		{"partial_tool_call_output without tool_call_id", model(Payload{Type: TypePartialToolCallOutput, Role: RoleUser, EventType: EventDelta}), "partial_tool_call_output without tool_call_id"},
		{"approval_decision without tool_call_id", event(Payload{Type: TypeApprovalDecision, Decision: DecisionAllow}), "approval_decision without tool_call_id"},
		{"partial without event_type", model(Payload{Type: TypePartialText, Role: RoleAssistant}), "partial_text without event_type"},
		{"bad event_type", model(Payload{Type: TypePartialThinking, Role: RoleAssistant, EventType: "end"}), `partial_thinking: bad event_type "end"`},
		{"bad event_type on tool partial", model(Payload{Type: TypePartialToolCall, Role: RoleAssistant, EventType: "START", ToolCallID: "c"}), `bad event_type "START"`},
		{"missing role", model(Payload{Type: TypeText}), `text: role "" is not user or assistant`},
		{"bad role", model(Payload{Type: TypeThinking, Role: "system"}), `thinking: role "system" is not user or assistant`},
		{"bad stop_reason", model(Payload{Type: TypeText, Role: RoleAssistant, StopReason: "length"}), `text: unknown stop_reason "length"`},
		{"bad request_end status", event(Payload{Type: TypeRequestEnd, Status: "ok"}), `request_end: unknown status "ok"`},
		{"missing request_end status", event(Payload{Type: TypeRequestEnd}), `request_end: unknown status ""`},
		{"bad decision", event(Payload{Type: TypeApprovalDecision, Decision: "maybe", ToolCallID: "c"}), `approval_decision: unknown decision "maybe"`},
		{"token_usage without request", event(Payload{Type: TypeTokenUsage, Session: u}), "token_usage without session or request"},
		{"token_usage without session", event(Payload{Type: TypeTokenUsage, Request: u}), "token_usage without session or request"},
		{"bad compaction reason", event(Payload{Type: TypeCompactionBegin, Reason: "size", Mode: ModeSummarize}), `compaction_begin: unknown reason "size"`},
		{"bad compaction mode", event(Payload{Type: TypeCompactionBegin, Reason: CompactTurns, Mode: "drop"}), `compaction_begin: unknown mode "drop"`},
		{"bad compaction_end status", event(Payload{Type: TypeCompactionEnd, Reason: CompactTurns, Mode: ModeDiscard, Status: "done"}), `compaction_end: unknown status "done"`},
		{"compaction_end bad reason", event(Payload{Type: TypeCompactionEnd, Reason: "", Mode: ModeDiscard, Status: StatusCompleted}), `compaction_end: unknown reason ""`},
		{"subagent without session_id", event(Payload{Type: TypeSubagent}), "subagent without session_id"},
		{"tool_list_ready with bad tools", event(Payload{Type: TypeToolListReady, Tools: json.RawMessage(`{"name":"x"}`)}), "tool_list_ready: tools"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want error mentioning %q", tc.wantErr)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("Validate() = %v, want it to wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate() = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
}

func TestDecodeReportsValidationErrors(t *testing.T) {
	tests := []struct {
		in      string
		wantErr string
	}{
		{evt(`{"type":"approval_decision","decision":"allow","tool_call_id":null}`), "approval_decision without tool_call_id"},
		{evt(`{"type":"token_usage","session":null,"request":{"total":1}}`), "token_usage without session or request"},
		{env(`{"type":"partial_text","role":"assistant","event_type":"middle","text":"x"}`), `bad event_type "middle"`},
		{`{"timestamp":"` + testStamp + `","type":"weird_msg","payload":{}}`, `unknown envelope type "weird_msg"`},
	}
	for _, tc := range tests {
		_, err := Decode([]byte(tc.in))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("Decode(%s) = %v, want ErrInvalid mentioning %q", tc.in, err, tc.wantErr)
		}
	}
}
