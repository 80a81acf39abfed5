package faults

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"floe.dev/pkg/omni"
)

// The engine running a Task is killed (SIGKILL) in the middle of a model
// request while a second engine runs: the Task is redelivered to the
// second engine once its ack wait passes, which closes the interrupted
// request as failed, retries it, and finishes the Task. Nothing is
// published twice (Session head, prompt), the tool call runs once, and the
// Trace equals the stream.
func TestEngineKilledMidRequest(t *testing.T) {
	c := newCluster(t, 1, 1, "FLOE_ENGINE_ACK_WAIT_MS=3000")
	c.service("tracer", "tracer")
	c.service("toolrunner", "toolrunner")
	knobs := []string{"FLOE_ENGINE_ACK_WAIT_MS=3000", "FLOE_RETRY_BASE_MS=50", "FLOE_RETRY_CAP_MS=200"}
	first := c.service("engine", "engine-1", knobs...)

	// A slow answer (30 deltas, 150 ms apart) then a tool call; then done.
	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			text(strings.Repeat("Thinking it through carefully. ", 10), 30, 150),
			execCall("call_a", logCmd+"; echo ran"),
		}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}})
	sid := c.session(ref)
	task := c.submit(sid, "take your time")

	// Wait until the first engine streams the answer, then start the
	// second engine and kill the first.
	streaming := make(chan struct{})
	go func() {
		defer close(streaming)
		c.waitFor(sid, 60*time.Second, func(r rec) bool {
			return r.isModel(omni.TypePartialText) && r.msg.Payload.EventType == omni.EventDelta
		})
	}()
	select {
	case <-streaming:
	case <-time.After(70 * time.Second):
		t.Fatal("the first engine never streamed")
	}
	c.service("engine", "engine-2", knobs...)
	first.kill(t)

	rs, status := c.wait(sid, task, 120*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q, want completed; last: %v", status, lastLabels(rs, 12))
	}
	o := checkSession(t, rs, "take your time")
	// The stream shows the interrupted request closed as failed, then its
	// retry, which completes.
	var ends []string
	var failedMsg string
	for _, r := range rs {
		if r.isEvent(omni.TypeRequestEnd) {
			ends = append(ends, r.msg.Payload.Status)
			if r.msg.Payload.Status == omni.StatusFailed && failedMsg == "" {
				failedMsg = r.msg.Payload.ErrorMessage
			}
		}
	}
	if len(ends) < 3 || ends[0] != omni.StatusFailed || ends[len(ends)-1] != omni.StatusCompleted {
		t.Errorf("request_end statuses %v, want failed (the interrupted request), then completed retries", ends)
	}
	if !strings.Contains(failedMsg, "engine") {
		t.Errorf("interrupted request's error message %q does not say the engine stopped", failedMsg)
	}
	if o.requests != len(ends) {
		t.Errorf("%d request_begin, %d request_end", o.requests, len(ends))
	}
	if o.dangling > 0 {
		t.Errorf("the killed engine's %d open segment(s) were not closed by the engine that took over", o.dangling)
	}
	if len(o.calls) != 1 || c.executions(sid, o.calls[0]) != 1 {
		t.Errorf("tool calls %v, executions of the first %d: want one call run once", o.calls, c.executions(sid, first0(o.calls)))
	}
	c.checkIdle(sid, omni.StatusCompleted)
	c.traceEqualsStream(sid)
	if !strings.Contains(c.procByName("engine-2").log(), `"task finished"`) {
		t.Error("the second engine did not finish the Task")
	}
	c.noViolations()
}

func first0(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// waitFor follows a Session's stream until match holds for a message.
func (c *cluster) waitFor(sid string, d time.Duration, match func(rec) bool) {
	c.t.Helper()
	done := false
	c.follow(sid, d, func(r rec) bool {
		done = match(r)
		return done
	})
	if !done {
		c.t.Errorf("no matching message in %s within %v", sid, d)
	}
}

// procByName returns a started process by its name.
func (c *cluster) procByName(name string) *proc {
	c.procs.mu.Lock()
	defer c.procs.mu.Unlock()
	for _, p := range c.procs.list {
		if p.name == name {
			return p
		}
	}
	c.t.Fatalf("no process %s", name)
	return nil
}

// An engine that stalls (SIGSTOP: a long GC pause, a frozen VM, a network
// partition) for longer than its ack wait loses its Task to another
// engine. When it wakes up (SIGCONT) it must not go on publishing for the
// Session beside the engine that took over: the stream must read as one
// run, with the tool call executed once.
func TestEngineStalledPastAckWaitDoesNotDoubleRun(t *testing.T) {
	c := newCluster(t, 1, 1, "FLOE_ENGINE_ACK_WAIT_MS=2000")
	c.service("tracer", "tracer")
	c.service("toolrunner", "toolrunner")
	knobs := []string{"FLOE_ENGINE_ACK_WAIT_MS=2000", "FLOE_RETRY_BASE_MS=50", "FLOE_RETRY_CAP_MS=200"}
	first := c.service("engine", "engine-1", knobs...)
	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			text(strings.Repeat("Thinking it through carefully. ", 10), 30, 150),
			execCall("call_a", logCmd+"; echo ran"),
		}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}})
	sid := c.session(ref)
	task := c.submit(sid, "take your time")
	if !c.follow(sid, 60*time.Second, func(r rec) bool {
		return r.isModel(omni.TypePartialText) && r.msg.Payload.EventType == omni.EventDelta
	}) {
		t.Fatal("the first engine never streamed")
	}
	c.service("engine", "engine-2", knobs...)
	if err := first.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The second engine takes over: it closes the interrupted request.
	if !c.follow(sid, 60*time.Second, func(r rec) bool {
		return r.isEvent(omni.TypeRequestEnd) && r.msg.Payload.Status == omni.StatusFailed
	}) {
		t.Fatal("the second engine did not take the Task over")
	}
	if err := first.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	rs, status := c.wait(sid, task, 120*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q; last: %v", status, lastLabels(rs, 12))
	}
	time.Sleep(3 * time.Second) // whatever the woken engine still publishes
	rs = c.all(sid, nil)
	o := checkSession(t, rs, "take your time")
	idles := 0
	for _, r := range rs {
		if r.class == omni.ClassServer && r.ev.Type == omni.ServerTaskState && r.ev.State == omni.StateIdle {
			idles++
		}
	}
	if idles != 1 {
		t.Errorf("%d task_state idle events, want 1", idles)
	}
	for _, id := range o.calls {
		if n := c.executions(sid, id); n != 1 {
			t.Errorf("%s ran %d times", id, n)
		}
	}
	if t.Failed() {
		t.Logf("stream: %v", lastLabels(withoutPartials(rs), 200))
	}
	c.noViolations()
}

func withoutPartials(rs []rec) []rec {
	var out []rec
	for _, r := range rs {
		if r.class == omni.ClassServer || !r.msg.IsPartial() {
			out = append(out, r)
		}
	}
	return out
}
