package e2e

import (
	"slices"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
)

// Bad tool input reaches the model as a clear failed output and the
// Session goes on.
func TestBadToolInputBecomesFailedOutput(t *testing.T) {
	e := start(t, envOpts{})
	tc := func(id, name, raw string) map[string]any {
		return map[string]any{"tool_call": map[string]any{"name": name, "id": id, "arguments_raw": raw}}
	}
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			tc("unknown", "launch_rockets", `{}`),
			tc("notjson", "exec_command", `{"cmd": "echo hi"`),
			tc("missing", "exec_command", `{"description": "no cmd"}`),
			tc("outside", "read_file", `{"file_path": "/etc/passwd"}`),
			tc("huge", "exec_command", `{"description": "100 MB", "cmd": "head -c 100000000 /dev/zero | tr '\\0' a"}`),
			tc("forever", "exec_command", `{"description": "never ends", "cmd": "sleep 1000", "timeout_ms": 500}`),
		}},
		map[string]any{"expect_tool_outputs": []string{"unknown", "notjson", "missing", "outside", "huge", "forever"},
			"steps": []any{map[string]any{"text": "I saw the errors."}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	task := e.submit(sid, "break things")
	rs, status := e.wait(sid, task)
	if status != omni.StatusCompleted {
		t.Fatalf("status = %q; stream %v", status, labels(rs, noPartials))
	}
	want := map[string]string{
		"unknown": "unknown tool", "notjson": "invalid arguments", "missing": `"cmd"`,
		"outside": "outside the workspace", "huge": "output truncated", "forever": "timed out",
	}
	got := map[string]omni.Payload{}
	for _, r := range rs {
		if r.class == omni.ClassModel && r.msg.Payload.Type == omni.TypeToolCallOutput {
			got[r.msg.Payload.ToolCallID] = r.msg.Payload
		}
	}
	for id, substr := range want {
		p, ok := got[id]
		if !ok {
			t.Errorf("%s: no output", id)
			continue
		}
		if !strings.Contains(p.Output, substr) {
			t.Errorf("%s: output %.200q does not mention %q", id, p.Output, substr)
		}
		if id != "huge" && p.StopReason != omni.StatusFailed {
			t.Errorf("%s: stop_reason %q, want failed", id, p.StopReason)
		}
		if len(p.Output) > 40000 {
			t.Errorf("%s: output of %d bytes is not capped", id, len(p.Output))
		}
	}
}

func TestMaxTurnsEndsWithNotice(t *testing.T) {
	e := start(t, envOpts{})
	step := map[string]any{"steps": []any{call("x", "echo again")}}
	ref := e.script(map[string]any{"requests": []any{step}, "after_last": "repeat_last"})
	sid := e.session(ref, omni.ApproveAllowAll, func(r *omni.SessionRecord) { r.MaxTurns = 2 })
	task := e.submit(sid, "loop forever")
	rs, status := e.wait(sid, task)
	if status != omni.StatusFailed {
		t.Fatalf("status = %q, want failed", status)
	}
	ls := labels(rs, noPartials)
	begins := 0
	for _, l := range ls {
		if l == "request_begin" {
			begins++
		}
	}
	if begins != 2 {
		t.Fatalf("%d requests, want 2: %v", begins, ls)
	}
	var last omni.Payload
	for _, r := range rs {
		if r.class == omni.ClassModel && r.msg.Payload.Type == omni.TypeText && r.msg.Payload.Role == omni.RoleAssistant {
			last = r.msg.Payload
		}
	}
	if last.Text != omni.MaxTurnsNotice(2) || last.StopReason != omni.StatusFailed {
		t.Fatalf("last assistant text = %q (%s), want the max-turns notice", last.Text, last.StopReason)
	}
	if indexOf(ls, "abort") >= 0 {
		t.Fatalf("max turns must not emit abort: %v", ls)
	}
	// Streamed like any text: start → delta → stop(failed) → complete,
	// the run's last messages before it goes idle.
	all := labels(rs, func(r rec) bool { return r.class != omni.ClassServer })
	tail := all[len(all)-4:]
	if want := []string{"partial_text:start", "partial_text:delta", "partial_text:stop", "text"}; !slices.Equal(tail, want) {
		t.Fatalf("stream ends %v, want %v", tail, want)
	}
	n := len(rs)
	for n > 0 && rs[n-1].class == omni.ClassServer {
		n--
	}
	stop, delta := rs[n-2].msg.Payload, rs[n-3].msg.Payload
	if stop.StopReason != omni.StatusFailed || delta.Text != omni.MaxTurnsNotice(2) {
		t.Fatalf("notice segment: delta %q, stop stop_reason %q", delta.Text, stop.StopReason)
	}
	checkDiscipline(t, rs)
	// The Trace has the complete notice only.
	traced := 0
	for _, f := range e.lcTrace(sid) {
		for _, m := range f.msgs {
			if m.IsPartial() {
				t.Fatalf("a partial in the Trace: %+v", m.Payload)
			}
			if m.Payload.Type == omni.TypeText && m.Payload.Text == omni.MaxTurnsNotice(2) {
				traced++
			}
		}
	}
	if traced != 1 {
		t.Fatalf("the notice is in the Trace %d times, want 1", traced)
	}
}
