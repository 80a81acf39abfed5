package task

import (
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// Steering sent while a tool runs is published as a [user_steering] user
// text before the next request and is in that request's context; once
// the run ended, a steer is refused (no Task answers it).
func TestSteeringReachesTheNextRequest(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"expect_last_user": "[user_steering]\nalso run the tests\n[/user_steering]", "steps": [{"text": "Built and tested."}]}
	]}`, nil)
	rec := h.recorded()
	sid := "steer1"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, func(omni.ToolJob) *omni.Message { return nil })
	done := h.run(sid, "t1", "build it")
	bustest.Eventually(t, 10*time.Second, "the job taken", func() bool { return len(fr.ran()) == 1 })
	if rep, err := h.control(sid, omni.CtlSteer, omni.Control{Text: "also run the tests"}); err != nil || !rep.OK {
		t.Fatalf("steer: %+v %v", rep, err)
	}
	out := omni.ToolCallOutput("call_1", "built", omni.StatusCompleted)
	fr.finish(sid, &out)
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q (model saw %v)%s", st, h.prov.Mismatches(), dump(h.messages(sid)))
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("model saw: %v", errs)
	}
	msgs := h.messages(sid)
	steer := index(msgs, func(m *omni.Message) bool {
		return m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleUser && strings.Contains(m.Payload.Text, "also run the tests")
	})
	output := index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	begins := []int{}
	for i, m := range msgs {
		if m.Payload.Type == omni.TypeRequestBegin {
			begins = append(begins, i)
		}
	}
	if steer < 0 || len(begins) != 2 || !(output < steer && steer < begins[1]) {
		t.Fatalf("steering@%d output@%d request_begins %v%s", steer, output, begins, dump(msgs))
	}
	second := rec.requests()[1]
	if last := second[len(second)-1]; last.Payload.Text != omni.Block(omni.TagUserSteering, "also run the tests") {
		t.Fatalf("second request ends with %+v", last.Payload)
	}
	if _, err := h.control(sid, omni.CtlSteer, omni.Control{Text: "too late"}); err == nil {
		t.Fatal("a steer after the run ended was answered")
	}
}

// retry-now cuts a reconnect wait short: with a one-minute backoff the
// retry starts as soon as retry_now arrives, and the reply says a wait was
// skipped; with no wait running the reply says nothing was skipped.
func TestRetryNowSkipsTheBackoff(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"error": {"status": "failed", "message": "bad gateway"}}]},
	  {"steps": [{"text": "Back."}]}
	]}`, func(s *Settings) { s.RetryBase, s.RetryCap = time.Minute, time.Minute })
	sid := "retrynow1"
	h.session(sid, omni.ApproveAllowAll)
	if rep, err := h.control(sid, omni.CtlRetryNow, omni.Control{}); err == nil {
		t.Fatalf("retry_now answered before any Task: %+v", rep)
	}
	done := h.run(sid, "t1", "hi")
	bustest.Eventually(t, 10*time.Second, "the failed attempt's request_end", func() bool {
		return len(requestEnds(h.messages(sid))) == 1
	})
	if got := requestEnds(h.messages(sid)); got[0] != (endWant{omni.StatusFailed, 1, 60000}) {
		t.Fatalf("request_end %+v", got[0])
	}
	// The wait starts after the request_end: ask until a wait is skipped.
	var rep omni.ControlReply
	bustest.Eventually(t, 10*time.Second, "retry_now skipping the wait", func() bool {
		var err error
		rep, err = h.control(sid, omni.CtlRetryNow, omni.Control{})
		return err == nil && rep.OK && rep.Skipped
	})
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q", st)
	}
	if got := requestEnds(h.messages(sid)); len(got) != 2 || got[1] != (endWant{omni.StatusCompleted, 2, 0}) {
		t.Fatalf("request_ends %v", got)
	}
}

// retry-now with no reconnect wait running is answered, skipping nothing.
func TestRetryNowWithoutAWaitSkipsNothing(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"steps": [{"text": "Built."}]}
	]}`, nil)
	sid := "retrynow2"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, func(omni.ToolJob) *omni.Message { return nil })
	done := h.run(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "the job taken", func() bool { return len(fr.ran()) == 1 })
	rep, err := h.control(sid, omni.CtlRetryNow, omni.Control{})
	if err != nil || !rep.OK || rep.Skipped {
		t.Fatalf("retry_now while a tool runs: %+v %v, want ok, nothing skipped", rep, err)
	}
	out := omni.ToolCallOutput("call_1", "built", omni.StatusCompleted)
	fr.finish(sid, &out)
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q", st)
	}
}
