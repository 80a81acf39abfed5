package e2e

import (
	"slices"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
)

// Controls during the reconnect ladder. The waits here are minutes long,
// so a Task that finishes at all proves the wait was skipped or ended.

// rcLongLadder makes every reconnect wait far longer than any test bound.
func rcLongLadder(c *engine.Config) { c.RetryBase, c.RetryCap = 10*time.Minute, 10*time.Minute }

func rcIsFailedEnd(r rec) bool {
	return r.class == omni.ClassEvent && r.msg.Payload.Type == omni.TypeRequestEnd && r.msg.Payload.Status == omni.StatusTimeout
}

// retry-now skips a running wait (Skipped true) and the next request
// begins at once; with no wait running it skips nothing (Skipped false).
// Either way the attempt count goes on as before.
func TestReconnectRetryNowSkipsTheWait(t *testing.T) {
	release := make(chan struct{})
	f := rcNewFake(t, rcHeld(release, rcReject(500, rcBody500)), rcAnswer("Hello there!"))
	e := rcEnv(t, f, rcLongLadder)
	sid := e.session(rcModel, omni.ApproveAllowAll, nil)
	task := e.submit(sid, "say hello")

	// While the first request is in flight there is no wait to skip.
	select {
	case <-f.arrived:
	case <-time.After(rcBound):
		t.Fatal("the first request never arrived")
	}
	if rep := rcControl(e, sid, omni.CtlRetryNow, omni.Control{}); !rep.OK || rep.Skipped {
		t.Fatalf("retry-now during a request = %+v, want OK and not skipped", rep)
	}
	close(release)

	end := rcWaitFor(e, sid, "the failed request_end", rcIsFailedEnd)
	if p := end.msg.Payload; p.Attempt != 1 || p.RetryInMs != (10*time.Minute).Milliseconds() {
		t.Fatalf("request_end = %+v, want attempt 1 waiting 10 minutes", p)
	}
	if n := f.requests(); n != 1 {
		t.Fatalf("%d requests after a retry-now with nothing to skip, want 1", n)
	}
	// The wait begins once the failed attempt's tools settled: ask until
	// it is running.
	var rep omni.ControlReply
	deadline := time.Now().Add(rcBound)
	for {
		rep = rcControl(e, sid, omni.CtlRetryNow, omni.Control{})
		if rep.Skipped || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !rep.OK || !rep.Skipped {
		t.Fatalf("retry-now during the wait = %+v, want OK and skipped", rep)
	}

	rs, status := e.wait(sid, task)
	if status != omni.StatusCompleted {
		t.Fatalf("task status = %q, want completed; stream:\n%v", status, labels(rs, noPartials))
	}
	got := rcFromFirstBegin(labels(rs, noPartials))
	want := []string{
		"request_begin", "token_usage", "request_end:timeout",
		"request_begin", "text", "token_usage", "request_end:completed",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("stream =\n%v\nwant\n%v", got, want)
	}
	ends := rcPayloads(rs, omni.TypeRequestEnd)
	if ends[1].Attempt != 2 {
		t.Fatalf("request_ends:%s\nwant the skipped wait's retry to be attempt 2", rcDescribeEnds(ends))
	}
	if n := f.requests(); n != 2 {
		t.Fatalf("fake got %d requests, want 2", n)
	}
}

// An abort during the wait ends the run at once, abort its last message,
// and no further request begins.
func TestReconnectAbortDuringWait(t *testing.T) {
	f := rcNewFake(t, rcReject(500, rcBody500))
	e := rcEnv(t, f, rcLongLadder)
	sid := e.session(rcModel, omni.ApproveAllowAll, nil)
	task := e.submit(sid, "say hello")
	rcWaitFor(e, sid, "the failed request_end", rcIsFailedEnd)
	if rep := rcControl(e, sid, omni.CtlAbort, omni.Control{}); !rep.OK {
		t.Fatalf("abort = %+v", rep)
	}
	rs, status := e.wait(sid, task)
	if status != omni.StatusAborted {
		t.Fatalf("task status = %q, want aborted; stream:\n%v", status, labels(rs, noPartials))
	}
	got := rcFromFirstBegin(labels(rs, noPartials))
	want := []string{"request_begin", "token_usage", "request_end:timeout", "abort"}
	if !slices.Equal(got, want) {
		t.Fatalf("stream =\n%v\nwant\n%v", got, want)
	}
	if n := f.requests(); n != 1 {
		t.Fatalf("fake got %d requests, want 1", n)
	}
}
