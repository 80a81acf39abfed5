package e2e

import (
	"slices"
	"testing"

	"floe.dev/pkg/omni"
)

func call(id, cmd string) map[string]any {
	return map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": id,
		"arguments": map[string]any{"description": id, "cmd": cmd}, "chunks": 3}}
}

// The seed's two-tool timeline: B finishes before A; B's output lands
// before token_usage, A's after request_end; the next request gets A's
// output before B's.
func TestSeedTwoToolTimeline(t *testing.T) {
	e := start(t, envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			map[string]any{"thinking": "I will run two tools.", "chunks": 3},
			map[string]any{"text": "Running A and B.", "chunks": 2},
			call("call_a", "sleep 1.2; echo A"),
			map[string]any{"delay_ms": 150},
			call("call_b", "echo B"),
			map[string]any{"delay_ms": 600},
		}},
		map[string]any{"expect_tool_outputs": []string{"call_a", "call_b"}, "steps": []any{
			map[string]any{"text": "Both done."},
		}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	task := e.submit(sid, "run two tools")
	rs, status := e.wait(sid, task)
	if status != omni.StatusCompleted {
		t.Fatalf("status = %q, want completed; stream:\n%v", status, labels(rs, nil))
	}
	checkDiscipline(t, rs)
	got := labels(rs, noPartials)
	first := indexOf(got, "request_begin")
	want := []string{
		"request_begin", "thinking", "text",
		"tool_call:call_a", "approval_decision:allow:call_a",
		"tool_call:call_b", "approval_decision:allow:call_b",
		"tool_call_output:call_b",
		"token_usage", "request_end:completed",
		"tool_call_output:call_a",
		"request_begin",
	}
	if first < 0 || len(got) < first+len(want) || !slices.Equal(got[first:first+len(want)], want) {
		t.Fatalf("timeline =\n%v\nwant it to contain, from the first request_begin,\n%v", got, want)
	}
	// Partials of thinking and text come before their completes.
	all := labels(rs, nil)
	all = all[indexOf(all, "request_begin"):]
	if indexOf(all, "partial_thinking:start") > indexOf(all, "thinking") || indexOf(all, "partial_text:start") > indexOf(all, "text") {
		t.Fatalf("partials after completes: %v", all)
	}
	// B's output partials precede token_usage; A's follow request_end.
	if indexOf(all, "partial_tool_call_output:start:call_b") > indexOf(all, "token_usage") {
		t.Fatalf("B's output not before token_usage: %v", all)
	}
	if indexOf(all, "partial_tool_call_output:start:call_a") < indexOf(all, "request_end:completed") {
		t.Fatalf("A's output not after request_end: %v", all)
	}
}
