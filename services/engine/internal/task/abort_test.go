package task

import (
	"slices"
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// An abort while a tool runs: the runner is asked to cancel, its
// interrupted output lands before abort, the finished call keeps its
// output, and abort is the last message of the run.
func TestAbortWithARunningToolEndsWithAbort(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"parallel_tool_calls": [
	    {"name": "exec_command", "id": "call_fast", "arguments": {"cmd": "echo fast"}},
	    {"name": "exec_command", "id": "call_slow", "arguments": {"cmd": "sleep 100"}}
	  ]}]},
	  {"steps": [{"text": "must not be asked"}]}
	]}`, nil)
	sid := "abort1"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, func(job omni.ToolJob) *omni.Message {
		if job.ToolCallID == "call_slow" {
			return nil // runs until cancelled
		}
		return echo(job)
	})
	done := h.run(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "both jobs taken", func() bool {
		return len(fr.ran()) == 2
	})
	bustest.Eventually(t, 10*time.Second, "call_fast's output on the stream", func() bool {
		return index(h.messages(sid), isType(omni.TypeToolCallOutput, "call_fast")) >= 0
	})
	msgs := h.abort(sid, done)
	last := msgs[len(msgs)-1]
	if last.Payload.Type != omni.TypeAbort || last.Payload.Reason != omni.AbortedByUser {
		t.Fatalf("last message is %s, want abort%s", last.Payload.Type, dump(msgs))
	}
	if n := len(slices.DeleteFunc(slices.Clone(msgs), func(m omni.Message) bool { return m.Payload.Type != omni.TypeAbort })); n != 1 {
		t.Fatalf("%d abort messages%s", n, dump(msgs))
	}
	slow := index(msgs, isType(omni.TypeToolCallOutput, "call_slow"))
	if slow < 0 || msgs[slow].Payload.Output != omni.InterruptedOutput || msgs[slow].Payload.StopReason != omni.StatusAborted {
		t.Fatalf("call_slow output missing or not interrupted%s", dump(msgs))
	}
	fast := index(msgs, isType(omni.TypeToolCallOutput, "call_fast"))
	if fast < 0 || msgs[fast].Payload.Output != "ran call_fast" {
		t.Fatalf("call_fast output%s", dump(msgs))
	}
	end := index(msgs, isType(omni.TypeRequestEnd, ""))
	if end < 0 || end > slow {
		t.Fatalf("request_end@%d should precede the interrupted output@%d%s", end, slow, dump(msgs))
	}
	if n := h.prov.Calls(sid); n != 1 {
		t.Fatalf("model called %d times, want 1 (no request after abort)", n)
	}
	// Nothing of the run lands after abort, also a moment later.
	time.Sleep(200 * time.Millisecond)
	if again := h.messages(sid); len(again) != len(msgs) {
		t.Fatalf("messages after abort:%s", dump(again[len(msgs):]))
	}
}
