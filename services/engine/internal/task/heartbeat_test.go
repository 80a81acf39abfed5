package task

import (
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// A runner that takes a job and then goes silent (died with the job
// running): after the heartbeat timeout the call gets the failed
// lost-runner output, the model is told, and the run goes on. The
// runner's own output, if it comes later, collapses with it (one output
// per call on the stream); the call is never run again.
func TestHeartbeatLossFailsTheRunningCall(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "The runner was lost."}]}
	]}`, func(s *Settings) { s.HeartbeatTimeout = 300 * time.Millisecond })
	sid := "beat1"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, func(omni.ToolJob) *omni.Message { return silent })
	if st := h.wait(h.run(sid, "t1", "go")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	out := index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	if out < 0 || msgs[out].Payload.StopReason != omni.StatusFailed ||
		!strings.Contains(msgs[out].Payload.Output, "tool runner lost: no heartbeat for 300ms") {
		t.Fatalf("call_1 output%s", dump(msgs))
	}
	if req2 := index(msgs[out:], isType(omni.TypeRequestBegin, "")); req2 < 0 {
		t.Fatalf("no request after the lost call%s", dump(msgs))
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("model saw: %v", errs)
	}
	// The runner's late output has the same Msg-Id: the stream drops it.
	late := omni.ToolCallOutput("call_1", "done after all", omni.StatusCompleted)
	fr.publish(fr.js, sid, &late)
	time.Sleep(100 * time.Millisecond)
	if n := count(h.messages(sid), isType(omni.TypeToolCallOutput, "call_1")); n != 1 {
		t.Fatalf("%d outputs for call_1, want 1", n)
	}
	if got := fr.ran(); len(got) != 1 {
		t.Fatalf("jobs run %v, want call_1 once", got)
	}
}

// A running job that keeps beating is never declared lost, however long
// it takes.
func TestHeartbeatsKeepALongCallAlive(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"steps": [{"text": "Built."}]}
	]}`, func(s *Settings) { s.HeartbeatTimeout = 300 * time.Millisecond })
	sid := "beat2"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, func(omni.ToolJob) *omni.Message { return nil })
	done := h.run(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "the job taken", func() bool { return len(fr.ran()) == 1 })
	time.Sleep(900 * time.Millisecond) // three heartbeat timeouts, beating every 100 ms
	out := omni.ToolCallOutput("call_1", "built", omni.StatusCompleted)
	fr.finish(sid, &out)
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	i := index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	if i < 0 || msgs[i].Payload.Output != "built" || count(msgs, isType(omni.TypeToolCallOutput, "")) != 1 {
		t.Fatalf("call_1 output%s", dump(msgs))
	}
}

// A job no runner takes within the heartbeat timeout (none is there) is
// withdrawn from the queue, so it never runs later, and the call gets a
// failed "not started" output; the run goes on.
func TestAJobNoRunnerTakesFailsAsNotStarted(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "Nobody ran it."}]}
	]}`, func(s *Settings) { s.HeartbeatTimeout = 300 * time.Millisecond })
	sid := "nostart1"
	h.session(sid, omni.ApproveAllowAll)
	if st := h.wait(h.run(sid, "t1", "go")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	out := index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	if out < 0 || msgs[out].Payload.StopReason != omni.StatusFailed ||
		!strings.Contains(msgs[out].Payload.Output, "tool not started: no tool runner took the job within 300ms") {
		t.Fatalf("call_1 output%s", dump(msgs))
	}
	// Withdrawn: a runner that comes now finds nothing to run.
	fr := h.runner(sid, func(omni.ToolJob) *omni.Message { return nil })
	time.Sleep(300 * time.Millisecond)
	if got := fr.ran(); len(got) != 0 {
		t.Fatalf("the withdrawn job ran later: %v", got)
	}
}

// A runner whose ack of a job was applied though it saw it fail (so it
// never ran the job, nor beat for it): the engine does not wait for ever;
// after the heartbeat timeout the call fails with an unknown outcome.
func TestAJobTakenButNeverStartedFails(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "It never started."}]}
	]}`, func(s *Settings) { s.HeartbeatTimeout = 300 * time.Millisecond })
	sid := "nostart2"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runnerNoBeat(sid)
	if st := h.wait(h.run(sid, "t1", "go")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	out := index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	if out < 0 || msgs[out].Payload.StopReason != omni.StatusFailed ||
		!strings.Contains(msgs[out].Payload.Output, "did not report it running within 300ms; the outcome is unknown") {
		t.Fatalf("call_1 output%s", dump(msgs))
	}
	if got := fr.ran(); len(got) != 1 {
		t.Fatalf("jobs taken %v, want call_1 once", got)
	}
}
