package task

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
		!strings.Contains(msgs[out].Payload.Output, `tool not started: no live tool runner of pool "default" took the job within 300ms`) {
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

// A saturated pool works through its queue: one runner with one slot
// takes three parallel calls one after another, each running 2.5 s
// (beating every 100 ms), so the last waits 5 s in the queue, five
// heartbeat timeouts. None is failed as not started (the runner is alive:
// it answers the pool's tool list requests); every call gets its runner's
// output. (A 300 ms timeout, 3 beats, failed a running call now and then
// at load 30-40 on this 2-core machine.)
func TestASaturatedPoolCompletesEveryQueuedCall(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"parallel_tool_calls": [
	    {"name": "exec_command", "id": "call_a", "arguments": {"cmd": "a"}},
	    {"name": "exec_command", "id": "call_b", "arguments": {"cmd": "b"}},
	    {"name": "exec_command", "id": "call_c", "arguments": {"cmd": "c"}}]}]},
	  {"expect_tool_outputs": ["call_a", "call_b", "call_c"], "steps": [{"text": "All three ran."}]}
	]}`, func(s *Settings) { s.HeartbeatTimeout = time.Second })
	sid := "busy1"
	h.session(sid, omni.ApproveAllowAll)
	ran := h.oneSlotRunner(sid, 2500*time.Millisecond)
	if st := h.wait(h.run(sid, "t1", "go")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	for _, id := range []string{"call_a", "call_b", "call_c"} {
		i := index(msgs, isType(omni.TypeToolCallOutput, id))
		if i < 0 || msgs[i].Payload.StopReason != omni.StatusCompleted || msgs[i].Payload.Output != "ran "+id {
			t.Errorf("%s's output%s", id, dump(msgs))
		}
	}
	if got := ran(); len(got) != 3 {
		t.Errorf("the runner ran %v, want the three calls once each", got)
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("model saw: %v", errs)
	}
}

// oneSlotRunner starts a runner of one slot: it fetches a job only when
// idle, beats for it every 100 ms while it "runs" for work, then
// publishes "ran <id>". It answers the pool's tool list requests. ran
// lists the jobs taken.
func (h *harness) oneSlotRunner(sid string, work time.Duration) (ran func() []string) {
	h.t.Helper()
	nc := bustest.Connect(h.t, h.env.Server)
	js, err := jetstream.New(nc)
	if err != nil {
		h.t.Fatal(err)
	}
	f := &fakeRunner{h: h, sid: sid, js: js}
	ctx, cancel := context.WithCancel(context.Background())
	cons, err := js.CreateOrUpdateConsumer(ctx, omni.ToolsStream, jetstream.ConsumerConfig{
		Durable: "one-slot-" + sid, FilterSubject: omni.ToolSubject(omni.DefaultPool, sid),
		AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	listSub := answerToolList(h.t, nc)
	var mu sync.Mutex
	var jobs []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for msg := range batch.Messages() {
				var job omni.ToolJob
				if omni.Unpack(msg.Data(), &job) != nil || msg.DoubleAck(ctx) != nil {
					continue
				}
				mu.Lock()
				jobs = append(jobs, job.ToolCallID)
				mu.Unlock()
				end := time.Now().Add(work)
				for time.Now().Before(end) && ctx.Err() == nil {
					f.beat(nc, job)
					time.Sleep(100 * time.Millisecond)
				}
				out := omni.ToolCallOutput(job.ToolCallID, "ran "+job.ToolCallID, omni.StatusCompleted)
				f.publish(js, job.SessionID, &out)
			}
		}
	}()
	h.t.Cleanup(func() {
		cancel()
		<-done
		_ = listSub.Unsubscribe()
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), jobs...)
	}
}

// A heartbeat counts only with the job's token (omni.ToolJob.BeatToken),
// which only the runner that pulled the job knows: another runner (any
// toolrunner user may publish on floe.hb.*) beating for a call it does
// not hold, with a wrong token or none, does not keep the call alive.
// The runner that holds it dies; the call is declared lost after the
// heartbeat timeout as if nobody had beaten.
func TestAHeartbeatWithoutTheJobsTokenKeepsNothingAlive(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "The runner was lost."}]}
	]}`, func(s *Settings) { s.HeartbeatTimeout = 400 * time.Millisecond })
	sid := "forged1"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, func(omni.ToolJob) *omni.Message { return silent }) // beats once with its token, then dies
	forger := bustest.Connect(t, h.env.Server)
	stop := make(chan struct{})
	forging := make(chan struct{})
	go func() {
		defer close(forging)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			hb := omni.Heartbeat{Runner: "forger", ToolCallIDs: []string{"call_1"}}
			if i%2 == 0 {
				hb.Tokens = []string{"not-the-token"}
			}
			b, _ := omni.Pack(&hb)
			_ = forger.Publish(omni.HeartbeatSubject(sid), b)
		}
	}()
	defer func() { close(stop); <-forging }()
	if st := h.wait(h.run(sid, "t1", "go")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	out := index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	if out < 0 || !strings.Contains(msgs[out].Payload.Output, "tool runner lost: no heartbeat for 400ms") {
		t.Fatalf("call_1 output%s", dump(msgs))
	}
	if got := fr.ran(); len(got) != 1 {
		t.Fatalf("jobs taken %v, want call_1 once", got)
	}
}

// vanish ends a running job as a runner that dies does: its heartbeats
// stop and no output is published.
func (f *fakeRunner) vanish(id string) {
	f.mu.Lock()
	ch := f.running[id]
	delete(f.running, id)
	f.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// A call resumed by another engine (the Task redelivered while its job
// runs) requires its job's own token, derived from the Session's BeatKey:
// a forger beating for it first with another token claims nothing. The
// runner that holds the job keeps it alive on the new engine; once that
// runner dies the call is lost after the heartbeat timeout, whatever the
// forger sends. Before, the resumed call took the first token reported
// for it, and a forger beating first kept a dead call alive for ever.
func TestAResumedCallRequiresItsJobsToken(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "The runner was lost."}]}
	]}`, func(s *Settings) {
		fastLease(s)
		s.HeartbeatTimeout = 1500 * time.Millisecond
	})
	sid := "forged2"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, func(omni.ToolJob) *omni.Message { return nil })
	_, done1 := h.start(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "the job taken", func() bool { return len(fr.ran()) == 1 })

	forger := bustest.Connect(t, h.env.Server)
	stop := make(chan struct{})
	forging := make(chan struct{})
	go func() {
		defer close(forging)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			b, _ := omni.Pack(&omni.Heartbeat{Runner: "forger", ToolCallIDs: []string{"call_1"}, Tokens: []string{"forged-token"}})
			_ = forger.Publish(omni.HeartbeatSubject(sid), b)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { close(stop); <-forging }()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, done2 := h.runTask(ctx, omni.Task{ID: "t1", Kind: omni.TaskRun, SessionID: sid,
		Input: []omni.InputPart{{Type: "text", Text: "go"}}})
	if res := h.waitResult(done1); !errors.Is(res.err, ErrLeaseLost) {
		t.Fatalf("first runner: %q %v, want ErrLeaseLost", res.status, res.err)
	}
	// The real runner keeps the resumed call alive past the timeout.
	time.Sleep(3 * time.Second)
	if msgs := h.messages(sid); index(msgs, isType(omni.TypeToolCallOutput, "call_1")) >= 0 {
		t.Fatalf("the resumed call ended while its runner beat with its token%s", dump(msgs))
	}
	fr.vanish("call_1")
	var res result
	select {
	case res = <-done2:
	case <-time.After(30 * time.Second):
		t.Fatal("the resumed call was kept alive by the forger's heartbeats")
	}
	if res.err != nil || res.status != Completed {
		t.Fatalf("second runner: %q %v", res.status, res.err)
	}
	msgs := h.messages(sid)
	out := index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	if out < 0 || !strings.Contains(msgs[out].Payload.Output, "tool runner lost") {
		t.Fatalf("call_1 output%s", dump(msgs))
	}
}
