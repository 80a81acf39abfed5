package task

import (
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

const twoCallsScript = `{"requests": [
  {"steps": [
    {"tool_call": {"name": "exec_command", "id": "call_a", "arguments": {"cmd": "echo A"}}},
    {"tool_call": {"name": "exec_command", "id": "call_b", "arguments": {"cmd": "echo B"}}}
  ]},
  {"expect_tool_outputs": ["call_a", "call_b"], "steps": [{"text": "done"}]}
]}`

// Under always-ask the calls of a request are decided one at a time in
// call order: the second call is not pending (and cannot be decided) while
// the first waits; each approval_decision follows its tool_call and
// precedes its output; a denied call is paired with the denied output and
// never reaches a runner.
func TestAlwaysAskDecisionsAreSequentialAndPrecedeOutputs(t *testing.T) {
	h := newHarness(t, twoCallsScript, nil)
	sid := "appr1"
	h.session(sid, omni.ApproveAlwaysAsk)
	fr := h.runner(sid, echo)
	done := h.run(sid, "t1", "run two")

	var p []string
	bustest.Eventually(t, 10*time.Second, "call_a pending", func() bool {
		p = h.pending(sid)
		return len(p) > 0
	})
	if len(p) != 1 || p[0] != "call_a" {
		t.Fatalf("pending = %v, want only [call_a]", p)
	}
	// call_b is not asked yet: deciding it is refused.
	rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: "call_b", Decision: omni.DecisionAllow})
	if err != nil || rep.OK || rep.Code != omni.CodeNotFound {
		t.Fatalf("approve call_b before its turn: rep=%+v err=%v, want not_found", rep, err)
	}
	if rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: "call_a", Decision: omni.DecisionAllow}); err != nil || !rep.OK {
		t.Fatalf("approve call_a: %+v %v", rep, err)
	}
	bustest.Eventually(t, 10*time.Second, "call_b pending", func() bool {
		p = h.pending(sid)
		return len(p) == 1 && p[0] == "call_b"
	})
	if rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: "call_b", Decision: omni.DecisionDeny}); err != nil || !rep.OK {
		t.Fatalf("deny call_b: %+v %v", rep, err)
	}
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q, want completed", st)
	}
	msgs := h.messages(sid)
	for _, id := range []string{"call_a", "call_b"} {
		call := index(msgs, isType(omni.TypeToolCall, id))
		dec := index(msgs, isType(omni.TypeApprovalDecision, id))
		outp := index(msgs, isType(omni.TypePartialToolCallOutput, id))
		out := index(msgs, isType(omni.TypeToolCallOutput, id))
		if call < 0 || dec < 0 || out < 0 || !(call < dec && dec < out) || (outp >= 0 && outp < dec) {
			t.Fatalf("%s: tool_call@%d decision@%d output@%d (partial@%d): want call < decision < output%s",
				id, call, dec, out, outp, dump(msgs))
		}
	}
	da := index(msgs, isType(omni.TypeApprovalDecision, "call_a"))
	db := index(msgs, isType(omni.TypeApprovalDecision, "call_b"))
	if !(da < db) || msgs[da].Payload.Decision != omni.DecisionAllow || msgs[db].Payload.Decision != omni.DecisionDeny {
		t.Fatalf("decisions: a@%d %q, b@%d %q%s", da, msgs[da].Payload.Decision, db, msgs[db].Payload.Decision, dump(msgs))
	}
	ob := msgs[index(msgs, isType(omni.TypeToolCallOutput, "call_b"))]
	if ob.Payload.Output != omni.DeniedByUser || ob.Payload.StopReason != omni.StatusAborted {
		t.Fatalf("denied output = %q/%q", ob.Payload.Output, ob.Payload.StopReason)
	}
	if oa := msgs[index(msgs, isType(omni.TypeToolCallOutput, "call_a"))]; oa.Payload.Output != "ran call_a" {
		t.Fatalf("call_a output %q", oa.Payload.Output)
	}
	if got := fr.ran(); len(got) != 1 || got[0] != "call_a" {
		t.Fatalf("runner got jobs %v, want only call_a", got)
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("model saw: %v", errs)
	}
	// The run ends with the final answer: nothing after the last request_end.
	if last := msgs[len(msgs)-1]; last.Payload.Type != omni.TypeRequestEnd || last.Payload.Status != omni.StatusCompleted {
		t.Fatalf("last message %s%s", last.Payload.Type, dump(msgs))
	}
}
