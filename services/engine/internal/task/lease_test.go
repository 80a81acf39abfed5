package task

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// serverEvents reads the Session's server events in order.
func (h *harness) serverEvents(sid string) []omni.ServerEvent {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []omni.ServerEvent
	err := bus.FollowUntil(ctx, h.env.JS, sid, []string{omni.ClassServer}, 0, true, func(sm bus.StreamMsg) error {
		var ev omni.ServerEvent
		if err := json.Unmarshal(sm.Data, &ev); err != nil {
			return err
		}
		out = append(out, ev)
		return nil
	})
	if err != nil {
		h.t.Fatalf("read server events: %v", err)
	}
	return out
}

func count(msgs []omni.Message, match func(*omni.Message) bool) int {
	n := 0
	for i := range msgs {
		if match(&msgs[i]) {
			n++
		}
	}
	return n
}

// fastLease makes a Runner confirm its lease every 150 ms (a third of
// the ack wait is the staleness bound, half of it the watcher's tick).
func fastLease(s *Settings) { s.AckWait = 900 * time.Millisecond }

// Another engine takes the Task over while a tool runs (the redelivered
// Task, run by a second Runner, takes a new lease): the first Runner stops
// and returns ErrLeaseLost without publishing anything more or releasing
// the Session; the second waits for the running call's output and finishes
// the Task. The model is asked once per turn, never twice.
func TestTakeoverStopsTheFirstRunnerWithErrLeaseLost(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "Done."}]}
	]}`, fastLease)
	sid := "lease1"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, func(omni.ToolJob) *omni.Message { return nil })
	r1, done1 := h.start(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "the job taken", func() bool { return len(fr.ran()) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, done2 := h.runTask(ctx, omni.Task{ID: "t1", Kind: omni.TaskRun, SessionID: sid,
		Input: []omni.InputPart{{Type: "text", Text: "go"}}})
	res := h.waitResult(done1)
	if !errors.Is(res.err, ErrLeaseLost) {
		t.Fatalf("first runner: %q %v, want ErrLeaseLost", res.status, res.err)
	}
	before := h.messages(sid)
	if rec := h.record(sid); rec.TaskID != "t1" || rec.State != omni.StateRunning || rec.Lease == "" || rec.Lease == r1.lease.token {
		t.Fatalf("record after the loss: task %q state %q lease %q (first runner's %q)", rec.TaskID, rec.State, rec.Lease, r1.lease.token)
	}
	out := omni.ToolCallOutput("call_1", "built", omni.StatusCompleted)
	fr.finish(sid, &out)
	if st := h.wait(done2); st != Completed {
		t.Fatalf("second runner: %q", st)
	}
	msgs := h.messages(sid)
	if n := h.prov.Calls(sid); n != 2 {
		t.Fatalf("model called %d times, want 2%s", n, dump(msgs))
	}
	if n := count(msgs, isType(omni.TypeRequestBegin, "")); n != 2 {
		t.Fatalf("%d request_begin, want 2%s", n, dump(msgs))
	}
	// Both Runners' first attempts start after the input (the second one's
	// input is a duplicate, acked with the first one's sequence): only the
	// lease in the attempt's Msg-Id keeps the second begin from being
	// dropped as the first's.
	var ids []string
	for _, s := range h.storedMsgs(sid) {
		if s.m.Payload.Type == omni.TypeRequestBegin {
			ids = append(ids, s.msgID)
		}
	}
	lease2 := h.record(sid).Lease
	if len(ids) != 2 || strings.Replace(ids[0], r1.lease.token, lease2, 1) != ids[1] || !strings.Contains(ids[1], "/"+lease2+"/") {
		t.Fatalf("request_begin Msg-Ids %q, want the same stem with lease %s then %s", ids, r1.lease.token, lease2)
	}
	if n := count(msgs, func(m *omni.Message) bool {
		return m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleAssistant
	}); n != 1 {
		t.Fatalf("%d answers, want 1%s", n, dump(msgs))
	}
	if len(msgs) < len(before) || dump(msgs[:len(before)]) != dump(before) {
		t.Fatalf("stream changed under the takeover:%s\nthen:%s", dump(before), dump(msgs))
	}
	// The redelivered input and the Task's begin are not published twice.
	if n := count(msgs, func(m *omni.Message) bool { return m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleUser }); n != 1 {
		t.Fatalf("%d user inputs, want 1%s", n, dump(msgs))
	}
	var idle, running int
	for _, ev := range h.serverEvents(sid) {
		if ev.Type == omni.ServerTaskState {
			switch ev.State {
			case omni.StateIdle:
				idle++
			case omni.StateRunning:
				running++
			}
		}
	}
	if idle != 1 || running != 1 {
		t.Fatalf("task_state running %d idle %d, want 1 and 1", running, idle)
	}
	if rec := h.record(sid); rec.State != omni.StateIdle || rec.LastStatus != omni.StatusCompleted {
		t.Fatalf("record at the end: state %q status %q", rec.State, rec.LastStatus)
	}
}

// The record names another lease while the model streams (this engine
// stalled and the Task went elsewhere): the Runner stops publishing at
// once, leaves the request open for the new owner, never releases the
// Session, and returns ErrLeaseLost.
func TestLeaseLostMidStreamStopsPublishing(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"text": "a long answer that streams for a while", "chunks": 40, "delay_ms": 25}]}
	]}`, fastLease)
	sid := "lease2"
	h.session(sid, omni.ApproveAllowAll)
	done := h.run(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "the answer streaming", func() bool {
		return count(h.classMessages(sid, []string{omni.ClassPartial}), func(m *omni.Message) bool {
			return m.Payload.EventType == omni.EventDelta
		}) >= 2
	})
	h.update(sid, func(r *omni.SessionRecord) { r.Lease = "another-engine" })
	res := h.waitResult(done)
	if !errors.Is(res.err, ErrLeaseLost) {
		t.Fatalf("run: %q %v, want ErrLeaseLost", res.status, res.err)
	}
	msgs := h.messages(sid)
	if i := index(msgs, isType(omni.TypeRequestEnd, "")); i >= 0 {
		t.Fatalf("request_end published after the lease was lost%s", dump(msgs))
	}
	if i := index(msgs, func(m *omni.Message) bool {
		return m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleAssistant
	}); i >= 0 {
		t.Fatalf("complete answer published after the lease was lost%s", dump(msgs))
	}
	deltas := count(msgs, func(m *omni.Message) bool { return m.Payload.EventType == omni.EventDelta })
	if deltas >= 40 {
		t.Fatalf("all %d deltas published: the Runner did not stop%s", deltas, dump(msgs))
	}
	for _, ev := range h.serverEvents(sid) {
		if ev.Type == omni.ServerTaskState && ev.State == omni.StateIdle {
			t.Fatalf("task_state idle published by a Runner that lost its lease")
		}
	}
	if rec := h.record(sid); rec.State != omni.StateRunning || rec.Lease != "another-engine" {
		t.Fatalf("record: state %q lease %q: the Session was released", rec.State, rec.Lease)
	}
	time.Sleep(200 * time.Millisecond)
	if again := h.messages(sid); len(again) != len(msgs) {
		t.Fatalf("messages after ErrLeaseLost:%s", dump(again[len(msgs):]))
	}
}

// The lease is lost while a compaction request streams: its request_end,
// the compaction_end and everything else the Runner would still publish
// are fenced off (they do not wait on the lease scope, the fence stops
// them); the new owner closes the compaction.
func TestLeaseLostDuringCompactionIsFenced(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"text": "Hello."}]},
	  {"steps": [{"text": "[summary]a long summary that streams for a while[/summary]", "chunks": 40, "delay_ms": 25}]}
	]}`, fastLease)
	sid := "lease3"
	h.compactingSession(sid)
	done := h.run(sid, "t1", "hi")
	bustest.Eventually(t, 10*time.Second, "the compaction request running", func() bool {
		msgs := h.messages(sid)
		b := index(msgs, isType(omni.TypeCompactionBegin, ""))
		return b >= 0 && index(msgs[b:], isType(omni.TypeRequestBegin, "")) >= 0
	})
	h.update(sid, func(r *omni.SessionRecord) { r.Lease = "another-engine" })
	res := h.waitResult(done)
	if !errors.Is(res.err, ErrLeaseLost) {
		t.Fatalf("run: %q %v, want ErrLeaseLost", res.status, res.err)
	}
	msgs := h.messages(sid)
	b := index(msgs, isType(omni.TypeCompactionBegin, ""))
	if tail := msgs[b:]; index(tail, isType(omni.TypeRequestEnd, "")) >= 0 || index(tail, isType(omni.TypeCompactionEnd, "")) >= 0 ||
		index(tail, isType(omni.TypeTokenUsage, "")) >= 0 {
		t.Fatalf("published after the lease was lost:%s", dump(tail))
	}
	time.Sleep(200 * time.Millisecond)
	if again := h.messages(sid); len(again) != len(msgs) {
		t.Fatalf("messages after ErrLeaseLost:%s", dump(again[len(msgs):]))
	}
}
