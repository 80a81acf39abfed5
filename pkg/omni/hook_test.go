package omni

import (
	"encoding/json"
	"testing"
)

// The hook record as the original writes it since 0.2.10 (hooks/tool-hook.ts
// and stop-hook.ts: hookEvent({hook, name, decision?, reason?, output?})):
// read, kept byte for byte, and understood.
func TestHookRecordOfTheOriginalIsKeptAndRead(t *testing.T) {
	line := `{"timestamp":"2026-09-03T10:00:01.000Z","type":"event_msg","payload":{"type":"hook","hook":"stop","name":"goal","decision":"continue","reason":"tests still fail","output":{"round":2,"done":false,"note":"x"}}}`
	var m Message
	if err := Unmarshal([]byte(line), &m); err != nil {
		t.Fatal(err)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("Validate = %v", err)
	}
	if got := string(MustMarshal(&m)); got != line {
		t.Fatalf("re-encoded\n%s\nwant\n%s", got, line)
	}
	r, ok := m.Payload.Hook()
	if !ok || r.Point != HookStop || r.Name != "goal" || r.Decision != DecisionContinue || r.Reason != "tests still fail" {
		t.Fatalf("Hook() = %+v, %v", r, ok)
	}
	if r.Output["round"] != json.Number("2") || r.Output["done"] != false || r.Output["note"] != "x" {
		t.Fatalf("output = %#v", r.Output)
	}
}

func TestHookEventEncodesTheOriginalsFieldOrder(t *testing.T) {
	tests := []struct {
		r    HookRecord
		want string
	}{
		{HookRecord{Point: HookPreToolUse, Name: "no-push", Decision: DecisionDeny, Reason: "pushes to main are refused", ToolCallID: "call_1"},
			`{"type":"hook","hook":"pre_tool_use","name":"no-push","decision":"deny","reason":"pushes to main are refused","tool_call_id":"call_1"}`},
		{HookRecord{Point: HookStop, Name: "ralph", Decision: DecisionContinue, Output: map[string]any{"b": true, "a": 1, "skip": []int{1}}},
			`{"type":"hook","hook":"stop","name":"ralph","decision":"continue","output":{"a":1,"b":true}}`},
		{HookRecord{Point: HookStop, Name: "audit", Reason: "hook failed: exit 2"},
			`{"type":"hook","hook":"stop","name":"audit","reason":"hook failed: exit 2"}`},
	}
	for _, tc := range tests {
		m := HookEvent(tc.r)
		b := MustMarshal(&m)
		var env struct{ Payload json.RawMessage }
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatal(err)
		}
		if string(env.Payload) != tc.want {
			t.Errorf("HookEvent(%+v) payload = %s, want %s", tc.r, env.Payload, tc.want)
		}
		m2, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(%s): %v", b, err)
		}
		r, ok := m2.Payload.Hook()
		if !ok || r.Point != tc.r.Point || r.Name != tc.r.Name || r.Decision != tc.r.Decision || r.ToolCallID != tc.r.ToolCallID {
			t.Errorf("decoded %+v, want %+v", r, tc.r)
		}
	}
}

// Since the original's 0.2.6 every stop_reason and status is one of
// completed, aborted, retryable, fatal (changelog/0.2.6/2026-08-24-stop-
// reason-converges-to-four-values.md); the retired spellings stay readable.
func TestTheOriginalsFourValueStopReasonsValidate(t *testing.T) {
	for _, s := range []string{StatusCompleted, StatusAborted, StatusRetryable, StatusFatal, StatusFailed, StatusTimeout, StatusMalformed, StatusAuth} {
		for _, line := range []string{
			`{"timestamp":"t","type":"model_msg","payload":{"type":"text","role":"assistant","text":"x","stop_reason":"` + s + `"}}`,
			`{"timestamp":"t","type":"event_msg","payload":{"type":"request_end","status":"` + s + `","error_code":"timeout","error_message":"m"}}`,
			`{"timestamp":"t","type":"event_msg","payload":{"type":"compaction_end","reason":"manual","mode":"summarize","status":"` + s + `","error_code":"rejected"}}`,
		} {
			m, err := Decode([]byte(line))
			if err != nil {
				t.Errorf("Decode(%s) = %v", line, err)
				continue
			}
			if got := string(MustMarshal(&m)); got != line {
				t.Errorf("re-encoded %s, want %s", got, line)
			}
		}
	}
	if _, err := Decode([]byte(`{"timestamp":"t","type":"event_msg","payload":{"type":"request_end","status":"maybe"}}`)); err == nil {
		t.Error("an unknown status validated")
	}
}

func TestDeniedByHook(t *testing.T) {
	if got, want := DeniedByHook("no-push", "pushes to main are refused"), "Tool call denied by the no-push hook: pushes to main are refused."; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := DeniedByHook("x", ""), "Tool call denied by the x hook."; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func FuzzHookRecord(f *testing.F) {
	for _, s := range []string{
		`{"timestamp":"t","type":"event_msg","payload":{"type":"hook","hook":"stop","name":"goal","decision":"continue","output":{"a":1}}}`,
		`{"timestamp":"t","type":"event_msg","payload":{"type":"hook","hook":7,"name":["x"],"output":[1],"reason":{"r":1}}}`,
		`{"timestamp":"t","type":"event_msg","payload":{"type":"hook","hook":"pre_tool_use","name":"n","decision":"deny","tool_call_id":"c"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		r, ok := m.Payload.Hook()
		if !ok {
			return
		}
		// What was read encodes again, and reads back the same.
		m2 := HookEvent(r)
		e := MustMarshal(&m2)
		m3, err := Decode(e)
		if err != nil {
			t.Fatalf("Decode(HookEvent(%+v)) = %v (%s)", r, err, e)
		}
		r3, ok := m3.Payload.Hook()
		if !ok || r3.Point != r.Point || r3.Name != r.Name || r3.Decision != r.Decision || r3.Reason != r.Reason || r3.ToolCallID != r.ToolCallID || len(r3.Output) != len(r.Output) {
			t.Fatalf("round trip %+v -> %+v", r, r3)
		}
	})
}
