package task

import (
	"slices"
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// decisions returns each call's approval decision, in stream order.
func decisions(msgs []omni.Message) []string {
	var out []string
	for _, m := range msgs {
		if m.Payload.Type == omni.TypeApprovalDecision {
			out = append(out, m.Payload.ToolCallID+"="+m.Payload.Decision)
		}
	}
	return out
}

func outputOf(t *testing.T, msgs []omni.Message, id string) omni.Payload {
	t.Helper()
	i := index(msgs, isType(omni.TypeToolCallOutput, id))
	if i < 0 {
		t.Fatalf("no output for %s%s", id, dump(msgs))
	}
	return msgs[i].Payload
}

const twoCalls = `{"requests": [
  {"steps": [{"parallel_tool_calls": [
    {"name": "read_file", "id": "call_r", "arguments": {"file_path": "a.txt"}},
    {"name": "exec_command", "id": "call_w", "arguments": {"cmd": "touch b.txt"}}
  ]}]},
  {"expect_tool_outputs": ["call_r", "call_w"], "steps": [{"text": "Done."}]}
]}`

// deny-all denies every call without asking: each gets the denied
// output, no job reaches a runner, and the model is told.
func TestDenyAllDeniesEveryCall(t *testing.T) {
	h := newHarness(t, twoCalls, nil)
	sid := "denyall"
	h.session(sid, omni.ApproveDenyAll)
	fr := h.runner(sid, echo)
	if st := h.wait(h.run(sid, "t1", "go")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	if got := decisions(msgs); !slices.Equal(got, []string{"call_r=deny", "call_w=deny"}) {
		t.Fatalf("decisions %v%s", got, dump(msgs))
	}
	for _, id := range []string{"call_r", "call_w"} {
		if p := outputOf(t, msgs, id); p.Output != omni.DeniedByUser || p.StopReason != omni.StatusAborted {
			t.Fatalf("%s output %q %q", id, p.Output, p.StopReason)
		}
	}
	if len(fr.ran()) != 0 {
		t.Fatalf("denied calls ran: %v", fr.ran())
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("model saw: %v", errs)
	}
}

// read-only runs a read tool without asking and asks for the others; a
// denied write never runs.
func TestReadOnlyAsksOnlyForWrites(t *testing.T) {
	h := newHarness(t, twoCalls, nil)
	sid := "readonly"
	h.session(sid, omni.ApproveReadOnly)
	fr := h.runner(sid, echo)
	done := h.run(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "call_w pending", func() bool {
		return slices.Equal(h.pending(sid), []string{"call_w"})
	})
	// The read ran while the write waits for its decision.
	bustest.Eventually(t, 10*time.Second, "call_r run before call_w is decided", func() bool {
		return slices.Equal(fr.ran(), []string{"call_r"})
	})
	if rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: "call_w", Decision: omni.DecisionDeny}); err != nil || !rep.OK {
		t.Fatalf("deny: %+v %v", rep, err)
	}
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	if got := decisions(msgs); !slices.Equal(got, []string{"call_r=allow", "call_w=deny"}) {
		t.Fatalf("decisions %v%s", got, dump(msgs))
	}
	if p := outputOf(t, msgs, "call_r"); p.Output != "ran call_r" {
		t.Fatalf("call_r output %q", p.Output)
	}
	if p := outputOf(t, msgs, "call_w"); p.Output != omni.DeniedByUser {
		t.Fatalf("call_w output %q", p.Output)
	}
	if got := fr.ran(); !slices.Equal(got, []string{"call_r"}) {
		t.Fatalf("ran %v, want call_r only", got)
	}
}

// The command policy is applied before the approval mode: under
// always-ask a forbidden exec_command is decided forbidden without being
// asked and never runs; the next call is asked as usual.
func TestCommandPolicyForbidsBeforeTheModeAsks(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"parallel_tool_calls": [
	    {"name": "exec_command", "id": "call_rm", "arguments": {"cmd": "rm -rf /"}},
	    {"name": "exec_command", "id": "call_ls", "arguments": {"cmd": "ls"}}
	  ]}]},
	  {"expect_tool_outputs": ["call_rm", "call_ls"], "steps": [{"text": "Done."}]}
	]}`, nil)
	sid := "policy"
	h.sessionWith(sid, omni.ApproveAlwaysAsk, func(r *omni.SessionRecord) {
		r.CommandPolicy = &omni.CommandPolicy{Source: "test", Rules: []omni.CommandRule{
			{Name: "no-rm-rf", Pattern: `^rm\s+-rf(\s|$)`},
		}}
	})
	fr := h.runner(sid, echo)
	done := h.run(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "call_ls pending", func() bool {
		return slices.Equal(h.pending(sid), []string{"call_ls"})
	})
	if rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: "call_ls", Decision: omni.DecisionAllow}); err != nil || !rep.OK {
		t.Fatalf("approve: %+v %v", rep, err)
	}
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	if got := decisions(msgs); !slices.Equal(got, []string{"call_rm=" + omni.DecisionForbidden, "call_ls=allow"}) {
		t.Fatalf("decisions %v%s", got, dump(msgs))
	}
	if p := outputOf(t, msgs, "call_rm"); p.Output != omni.DeniedByPolicy || p.StopReason != omni.StatusAborted {
		t.Fatalf("call_rm output %q %q", p.Output, p.StopReason)
	}
	if got := fr.ran(); !slices.Equal(got, []string{"call_ls"}) {
		t.Fatalf("ran %v, want call_ls only", got)
	}
}

// max_turns ends a run that keeps calling tools: after n requests the
// notice streams like any text (start, delta, stop with stop_reason
// failed, then the complete text), the Task fails, the model is not asked
// again, and nothing follows the notice (no abort).
func TestMaxTurnsEndsTheRunWithTheNotice(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "a"}}}]},
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_2", "arguments": {"cmd": "b"}}}]},
	  {"steps": [{"text": "never asked"}]}
	]}`, nil)
	sid := "maxturns"
	h.sessionWith(sid, omni.ApproveAllowAll, func(r *omni.SessionRecord) { r.MaxTurns = 2 })
	h.runner(sid, echo)
	if st := h.wait(h.run(sid, "t1", "go")); st != Failed {
		t.Fatalf("status %q, want failed", st)
	}
	if n := h.prov.Calls(sid); n != 2 {
		t.Fatalf("model called %d times, want 2", n)
	}
	msgs := h.messages(sid)
	notice := omni.MaxTurnsNotice(2)
	tail := msgs[len(msgs)-4:]
	var shape []string
	for _, m := range tail {
		shape = append(shape, m.Payload.Type+"/"+m.Payload.EventType+"/"+m.Payload.Content()+"/"+m.Payload.StopReason)
	}
	want := []string{
		"partial_text/start//",
		"partial_text/delta/" + notice + "/",
		"partial_text/stop//failed",
		"text//" + notice + "/failed",
	}
	if !slices.Equal(shape, want) {
		t.Fatalf("run ends with\n%q\nwant\n%q%s", shape, want, dump(msgs))
	}
	if index(msgs, isType(omni.TypeAbort, "")) >= 0 {
		t.Fatalf("abort after max turns%s", dump(msgs))
	}
	if rec := h.record(sid); rec.State != omni.StateIdle || rec.LastStatus != omni.StatusFailed {
		t.Fatalf("record state %q status %q", rec.State, rec.LastStatus)
	}
}
