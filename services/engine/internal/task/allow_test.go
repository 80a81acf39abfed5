package task

import (
	"slices"
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

const threeWrites = `{"requests": [
  {"steps": [{"parallel_tool_calls": [
    {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "touch a"}},
    {"name": "read_file", "id": "call_r", "arguments": {"file_path": "a"}},
    {"name": "exec_command", "id": "call_2", "arguments": {"cmd": "touch b"}}
  ]}]},
  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_3", "arguments": {"cmd": "touch c"}}}]},
  {"steps": [{"text": "Done."}]},
  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_4", "arguments": {"cmd": "touch d"}}}]},
  {"steps": [{"text": "Done again."}]}
]}`

// An allow with scope session stores the tool with the Session: the
// engine allows its later calls (this request's, the next request's and
// the next Task's) without asking, while other tools are still asked.
func TestAllowForSessionAllowsTheToolsLaterCalls(t *testing.T) {
	h := newHarness(t, threeWrites, nil)
	sid := "allowsession"
	h.session(sid, omni.ApproveAlwaysAsk)
	fr := h.runner(sid, echo)
	done := h.run(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "call_1 pending", func() bool {
		return slices.Equal(h.pending(sid), []string{"call_1"})
	})
	if rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: "call_1", Decision: omni.DecisionDeny, Scope: omni.ScopeSession}); err != nil || rep.Code != omni.CodeBadRequest {
		t.Fatalf("deny with scope session: %+v %v, want bad_request", rep, err)
	}
	if rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: "call_1", Decision: omni.DecisionAllow, Scope: omni.ScopeSession}); err != nil || !rep.OK {
		t.Fatalf("allow for the session: %+v %v", rep, err)
	}
	if got := h.record(sid).AllowedTools; !slices.Equal(got, []string{"exec_command"}) {
		t.Fatalf("AllowedTools %q", got)
	}
	// read_file is another tool: still asked.
	bustest.Eventually(t, 10*time.Second, "call_r pending", func() bool {
		return slices.Equal(h.pending(sid), []string{"call_r"})
	})
	if rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: "call_r", Decision: omni.DecisionAllow}); err != nil || !rep.OK {
		t.Fatalf("allow call_r: %+v %v", rep, err)
	}
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q", st)
	}
	// The next Task (any engine, any client) finds it in the record.
	if st := h.wait(h.run(sid, "t2", "again")); st != Completed {
		t.Fatalf("second Task %q", st)
	}
	msgs := h.messages(sid)
	want := []string{"call_1=allow", "call_r=allow", "call_2=allow", "call_3=allow", "call_4=allow"}
	if got := decisions(msgs); !slices.Equal(got, want) {
		t.Fatalf("decisions %v, want %v%s", got, want, dump(msgs))
	}
	// Nobody answered call_2, call_3 or call_4: had they been asked, the
	// Tasks would still wait.
	if got := fr.ran(); len(got) != 5 {
		t.Fatalf("ran %v", got)
	}
}

// deny-all still denies a tool allowed for the Session, and the command
// policy still forbids.
func TestAllowedToolsDoNotOverrideDenyAll(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"parallel_tool_calls": [
	    {"name": "exec_command", "id": "call_ok", "arguments": {"cmd": "touch a"}},
	    {"name": "exec_command", "id": "call_rm", "arguments": {"cmd": "rm -rf /"}}
	  ]}]},
	  {"steps": [{"text": "Done."}]}
	]}`, nil)
	sid := "denyallallowed"
	h.sessionWith(sid, omni.ApproveDenyAll, func(r *omni.SessionRecord) { r.AllowedTools = []string{"exec_command"} })
	h.runner(sid, echo)
	if st := h.wait(h.run(sid, "t1", "go")); st != Completed {
		t.Fatalf("status %q", st)
	}
	// The policy's veto is stored right after its call; the mode's deny
	// beside the stream: their order is free, the decisions are not.
	got := decisions(h.messages(sid))
	slices.Sort(got)
	if !slices.Equal(got, []string{"call_ok=deny", "call_rm=forbidden"}) {
		t.Fatalf("decisions %v", got)
	}
}
