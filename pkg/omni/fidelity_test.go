package omni

import (
	"strings"
	"testing"
)

// Records the original writes that Floe must read, keep and re-encode byte
// for byte (protocol.md §1): unknown event types (also with known field names
// holding other types), unknown payload fields, model_context_window
// "unknown", records without stop_reason.
func TestOriginalRecordsRoundTrip(t *testing.T) {
	lines := []string{
		`{"timestamp":"2026-07-18T03:10:22.531Z","type":"session_meta","payload":{"session_id":"session-2026-07-18-11-10-22-3f8a1c2d","provider":"deepseek","model_id":"deepseek-v4-pro","model_context_window":"unknown","system_prompt":"be brief","tools":[{"name":"exec_command"}],"thinking_level":"medium","agent_state":"/a","workspace":"/w"}}`,
		evt(`{"type":"mcp_connect_begin","servers":["files"]}`),
		evt(`{"type":"goal_finished","status":{"ok":true},"turns":"three","context":[1,2],"note":"x"}`),
		evt(`{"type":"goal_finished","status":"completed","summary":"done"}`),
		evt(`{"type":"compaction_end","reason":"context","mode":"summarize","status":"failed","attempt":3,"error_message":"empty summary"}`),
		env(`{"type":"text","role":"user","text":"hi"}`),
		env(`{"type":"tool_call","role":"assistant","name":"exec_command","arguments":"{}","tool_call_id":"call_0","stop_reason":"completed","phase":"final"}`),
	}
	for _, in := range lines {
		m, err := Decode([]byte(in))
		if err != nil {
			t.Fatalf("Decode(%s): %v", in, err)
		}
		out, err := Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != in {
			t.Errorf("round trip:\n got %s\nwant %s", out, in)
		}
	}
	m, _ := Decode([]byte(lines[0]))
	if !m.Payload.ContextWindowUnknown || m.Payload.ModelContextWindow != 0 {
		t.Errorf("model_context_window \"unknown\" read as %d (unknown %v)", m.Payload.ModelContextWindow, m.Payload.ContextWindowUnknown)
	}
	g, _ := Decode([]byte(lines[2]))
	if g.Payload.Type != "goal_finished" || g.Payload.Status != "" || g.Payload.Turns != 0 {
		t.Errorf("unknown event's odd fields were interpreted: %+v", g.Payload)
	}
	txt, _ := Decode([]byte(lines[5]))
	if txt.Payload.Stop() != StatusCompleted {
		t.Errorf("missing stop_reason reads as %q, want completed", txt.Payload.Stop())
	}
	// A known type keeps its strict field types.
	if _, err := Decode([]byte(evt(`{"type":"request_end","status":{"x":1}}`))); err == nil {
		t.Error("request_end with an object status decoded")
	}
	if _, err := Decode([]byte(`{"timestamp":"x","type":"session_meta","payload":{"session_id":"s","model_context_window":"big"}}`)); err == nil {
		t.Error(`model_context_window "big" decoded`)
	}
}

func TestWrittenRecordsCarryStopReasonAndUnknownWindow(t *testing.T) {
	for _, m := range []Message{UserText("hi"), Text(RoleAssistant, "a"), Thinking("t"), ToolCall("x", "{}", "c"), ToolCallOutput("c", "o", "")} {
		b := MustMarshal(&m)
		if !strings.Contains(string(b), `"stop_reason":"completed"`) {
			t.Errorf("%s has no stop_reason completed", b)
		}
	}
	p := Partial(TypeText, EventDelta, "x", "", "")
	if b := MustMarshal(&p); strings.Contains(string(b), "stop_reason") {
		t.Errorf("a partial got a stop_reason: %s", b)
	}
	out := ToolCallOutput("c", DeniedByUser, StatusAborted)
	if out.Payload.StopReason != StatusAborted {
		t.Errorf("explicit stop reason replaced: %q", out.Payload.StopReason)
	}
	meta := SessionMeta(Meta{SessionID: "s", Provider: "openai", ModelID: "m"})
	if b := MustMarshal(&meta); !strings.Contains(string(b), `"model_context_window":"unknown"`) {
		t.Errorf("meta without a window = %s, want \"unknown\"", b)
	}
	meta = SessionMeta(Meta{SessionID: "s", ModelContextWindow: 128000})
	if b := MustMarshal(&meta); !strings.Contains(string(b), `"model_context_window":128000`) {
		t.Errorf("meta = %s", b)
	}
}

func TestBlocks(t *testing.T) {
	if got := Block(TagUserSteering, "go left"); got != "[user_steering]\ngo left\n[/user_steering]" {
		t.Fatalf("Block = %q", got)
	}
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"[context_summary]\nWe read a.txt.\n[/context_summary]", "We read a.txt.", true},
		{"[context_summary]We read a.txt.[/context_summary]", "We read a.txt.", true},
		{"  [context_summary]\ntwo\nlines\n[/context_summary]\n", "two\nlines", true},
		{"[context_summary]\n\n[/context_summary]", "", true},
		{"[summary]x[/summary]", "", false},
		{"see [context_summary]x[/context_summary]", "", false},
		{"[context_summary]x", "", false},
	} {
		got, ok := ParseBlock(tc.in, TagContextSummary)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseBlock(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
