package task

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// The recovery paths the failover loops found (request_begin stored first
// and once, attempt Msg-Ids per lease, tool jobs published again), each
// forced on one embedded nats-server: a stream that refuses what it is
// sent (a discard-new limit the stream is at: "maximum messages
// exceeded", a 503 the publishers retry), or an acknowledgement lost after
// the broker stored the message (ackLoss).

// refuse makes stream refuse every new message (discard new at the
// count it holds, with a parked message on an unused subject when it is
// empty: a work queue), until the returned restore runs.
func (h *harness) refuse(stream string) (restore func()) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := h.env.JS.Stream(ctx, stream)
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		// A work queue with nothing in it: park a job no consumer takes.
		if _, err := h.env.JS.Publish(ctx, omni.ToolSubject("parked", "none"), []byte("x")); err != nil {
			h.t.Fatal(err)
		}
		info.State.Msgs = 1
	}
	old := info.Config
	cfg := old
	cfg.Discard, cfg.MaxMsgs = jetstream.DiscardNew, int64(info.State.Msgs)
	if _, err := h.env.JS.UpdateStream(ctx, cfg); err != nil {
		h.t.Fatalf("update %s: %v", stream, err)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := h.env.JS.UpdateStream(ctx, old); err != nil {
				h.t.Errorf("restore %s: %v", stream, err)
			}
		})
	}
	h.t.Cleanup(restore)
	return restore
}

// ackLoss is the client side of a broker whose acknowledgement never
// arrives: PublishMsg of a message lose picks is published (the broker
// stores it) and then fails as a timeout, as after a leader change or a
// slow leader; the publisher cannot tell it from a message never stored.
type ackLoss struct {
	jetstream.JetStream
	lose func(m *nats.Msg) bool
	lost atomic.Int32
}

func (a *ackLoss) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := a.JetStream.PublishMsg(ctx, m, opts...)
	if err == nil && a.lose(m) {
		a.lost.Add(1)
		return nil, fmt.Errorf("lost ack of a stored message: %w", nats.ErrTimeout)
	}
	return ack, err
}

// loseFirst picks the first message whose subject and Msg-Id match.
func loseFirst(subject, msgID string) func(*nats.Msg) bool {
	var done atomic.Bool
	re := regexp.MustCompile(msgID)
	return func(m *nats.Msg) bool {
		return strings.HasPrefix(m.Subject, subject) && re.MatchString(m.Header.Get(jetstream.MsgIDHeader)) && done.CompareAndSwap(false, true)
	}
}

// stored is a Session message with its Msg-Id.
type stored struct {
	seq   uint64
	msgID string
	m     omni.Message
}

// storedMsgs reads the Session's messages (server events included as
// undecoded) with their Msg-Ids, in stream order.
func (h *harness) storedMsgs(sid string) []stored {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := h.env.JS.OrderedConsumer(ctx, omni.SessionsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{omni.SessionWildcard(sid)}})
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []stored
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			h.t.Fatal(err)
		}
		for msg := range batch.Messages() {
			md, _ := msg.Metadata()
			s := stored{seq: md.Sequence.Stream, msgID: msg.Headers().Get(jetstream.MsgIDHeader)}
			s.m, _ = omni.Decode(msg.Data())
			out = append(out, s)
			left--
		}
		if batch.Error() != nil {
			h.t.Fatal(batch.Error())
		}
	}
	return out
}

// checkBrackets fails unless request_begin and request_end alternate,
// every model message of the engine's own stream is inside a request, and
// no segment is left open.
func checkBrackets(t *testing.T, msgs []omni.Message) {
	t.Helper()
	open := false
	segs := map[string]bool{}
	for i, m := range msgs {
		p := &m.Payload
		switch {
		case p.Type == omni.TypeRequestBegin:
			if open {
				t.Fatalf("request_begin@%d inside an open request%s", i, dump(msgs))
			}
			open = true
		case p.Type == omni.TypeRequestEnd:
			if !open {
				t.Fatalf("request_end@%d without its request_begin%s", i, dump(msgs))
			}
			open = false
		case m.IsPartial() && omni.CompleteType(p.Type) != omni.TypeToolCallOutput:
			if !open {
				t.Fatalf("%s@%d outside a request%s", p.Type, i, dump(msgs))
			}
			key := p.Type + p.ToolCallID
			switch p.EventType {
			case omni.EventStart:
				segs[key] = true
			case omni.EventStop:
				delete(segs, key)
			}
		}
	}
	if open || len(segs) > 0 {
		t.Fatalf("left open: request %v, segments %v%s", open, segs, dump(msgs))
	}
}

// retryNow skips the reconnect wait of the Task running on sid, once one
// is running.
func (h *harness) retryNow(sid string) {
	h.t.Helper()
	bustest.Eventually(h.t, 10*time.Second, "a reconnect wait to skip", func() bool {
		rep, err := h.control(sid, omni.CtlRetryNow, omni.Control{})
		return err == nil && rep.Skipped
	})
}

// logs makes the Runners log to a buffer the test reads.
func (h *harness) logs() *bustest.Buffer {
	lb := &bustest.Buffer{}
	h.deps.Log = zerolog.New(lb)
	return lb
}

// failThenDone is a script whose first request fails and whose second
// answers.
const failThenDone = `{"requests": [
  {"steps": [{"error": {"status": "failed", "message": "bad gateway"}}]},
  {"steps": [{"text": "Done."}]}
]}`

// slowLadder waits a minute before each reconnect (retry_now skips it), at
// most retries times, and bounds the producers' Msg-Id retries by
// deadline (0: the default).
func slowLadder(retries int, deadline time.Duration) func(*Settings) {
	return func(s *Settings) {
		s.RetryBase, s.RetryCap, s.RetryMax = time.Minute, time.Minute, retries
		s.PublishSyncDeadline = deadline
	}
}

// runFailedOnce starts Task t1 on a new allow-all Session sid and waits
// for its first request_end (the script's failure): the Runner then waits
// to reconnect.
func (h *harness) runFailedOnce(sid string) <-chan result {
	h.t.Helper()
	h.session(sid, omni.ApproveAllowAll)
	done := h.run(sid, "t1", "hi")
	bustest.Eventually(h.t, 10*time.Second, "the first request_end", func() bool {
		return len(requestEnds(h.messages(sid))) == 1
	})
	return done
}

// While the stream refuses the retry's request_begin (the publisher
// retries it), nothing of the attempt goes out and the model is not
// called; once the stream takes it again, the begin is stored once, with
// the attempt's Msg-Id (Task, lease, first sequence, attempt), and the
// attempt follows it. A begin that went out in the attempt's batch would
// be lost with it and its request_end stored without it.
func TestRequestBeginIsStoredFirstWhileTheStreamRefusesIt(t *testing.T) {
	h := newHarness(t, failThenDone, slowLadder(1, 0))
	sid := "begin1"
	done := h.runFailedOnce(sid)
	restore := h.refuse(omni.SessionsStream)
	h.retryNow(sid)
	time.Sleep(300 * time.Millisecond)
	if n := h.prov.Calls(sid); n != 1 {
		t.Fatalf("the model was called %d times while the retry's request_begin was not stored, want 1", n)
	}
	restore()
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q%s", st, dump(h.messages(sid)))
	}
	msgs := h.messages(sid)
	checkBrackets(t, msgs)
	if got := requestEnds(msgs); len(got) != 2 || got[0] != (endWant{omni.StatusFailed, 1, 60000}) || got[1] != (endWant{omni.StatusCompleted, 2, 0}) {
		t.Fatalf("request_ends %v%s", got, dump(msgs))
	}
	lease := h.record(sid).Lease
	var begins []stored
	for _, s := range h.storedMsgs(sid) {
		if s.m.Payload.Type == omni.TypeRequestBegin {
			begins = append(begins, s)
		}
	}
	if len(begins) != 2 {
		t.Fatalf("%d request_begin stored, want 2%s", len(begins), dump(msgs))
	}
	for i, b := range begins {
		// The stem's sequence is the first one the attempt can have.
		want := fmt.Sprintf("t1/%s/a%d-%d/begin", lease, b.seq, i+1)
		if b.msgID != want {
			t.Fatalf("begin %d Msg-Id %q, want %q", i+1, b.msgID, want)
		}
	}
}

// The stream refuses a retry's request_begin for longer than the
// publisher retries a message (its sync deadline): the Runner does not
// stream the attempt without it (its request_end would end a request the
// stream never began). The attempt fails unseen, nothing of it on the
// stream and the model not called, and the ladder's next attempt begins
// once the stream takes messages again.
func TestRequestBeginRefusedPastTheDeadlineFailsTheAttemptUnseen(t *testing.T) {
	h := newHarness(t, failThenDone, slowLadder(2, 200*time.Millisecond))
	lb := h.logs()
	sid := "begin3"
	done := h.runFailedOnce(sid)
	restore := h.refuse(omni.SessionsStream)
	h.retryNow(sid)
	bustest.Eventually(t, 10*time.Second, "the second attempt's begin given up", func() bool { return lb.Contains("request_begin not stored") })
	if n := h.prov.Calls(sid); n != 1 {
		t.Fatalf("the model was called %d times without the attempt's request_begin stored, want 1", n)
	}
	restore()
	h.retryNow(sid)
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q%s", st, dump(h.messages(sid)))
	}
	msgs := h.messages(sid)
	checkBrackets(t, msgs)
	if got := requestEnds(msgs); len(got) != 2 || got[0] != (endWant{omni.StatusFailed, 1, 60000}) || got[1] != (endWant{omni.StatusCompleted, 3, 0}) {
		t.Fatalf("request_ends %v, want (failed,1,60000) (completed,3,0)%s", got, dump(msgs))
	}
}

// As above, but the stream stored the begin while the publisher gave it
// up (every ack of it lost: a slow leader): the next attempt sends the
// same begin again, the stream answers with the stored one, and the
// attempt goes on under it; no second begin opens inside the first.
func TestARequestBeginStoredUnconfirmedIsTheNextAttempts(t *testing.T) {
	h := newHarness(t, failThenDone, slowLadder(2, 200*time.Millisecond))
	lb := h.logs()
	sid := "begin4"
	var slow atomic.Bool
	slow.Store(true)
	begin2 := regexp.MustCompile(`-2/begin$`)
	al := &ackLoss{JetStream: h.env.JS, lose: func(m *nats.Msg) bool {
		return slow.Load() && begin2.MatchString(m.Header.Get(jetstream.MsgIDHeader))
	}}
	h.deps.PubJS = al
	done := h.runFailedOnce(sid)
	h.retryNow(sid)
	bustest.Eventually(t, 10*time.Second, "the second attempt's begin given up", func() bool { return lb.Contains("request_begin not stored") })
	slow.Store(false)
	if n := h.prov.Calls(sid); n != 1 || al.lost.Load() < 2 {
		t.Fatalf("model called %d times, %d acks lost; want 1 call and every try of the begin unacknowledged", n, al.lost.Load())
	}
	h.retryNow(sid)
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q%s", st, dump(h.messages(sid)))
	}
	msgs := h.messages(sid)
	checkBrackets(t, msgs)
	if got := requestEnds(msgs); len(got) != 2 || got[1] != (endWant{omni.StatusCompleted, 3, 0}) {
		t.Fatalf("request_ends %v, want the third attempt completed%s", got, dump(msgs))
	}
}

// The broker stores a message the Runner published with a Msg-Id but its
// ack is lost: the publisher sends it again, the stream drops the
// duplicate, and the Runner still folds what it published (the duplicate
// was stored after it read the history), so the model context is whole:
// for a lost request_begin the turn (its tool call) is in the next
// request's context with its output, for the lost input the Task's input
// is there. Each is stored once.
func TestALostAckStoresOnceAndKeepsTheContext(t *testing.T) {
	for _, c := range []struct{ name, msgID string }{
		{"request_begin", `^t1/[0-9a-f]+/a[0-9]+-1/begin$`},
		{"input", `^t1/in/0$`},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, twoTurns, nil)
			sid := "ackloss"
			al := &ackLoss{JetStream: h.env.JS, lose: loseFirst(omni.SessionSubject(sid, ""), c.msgID)}
			h.deps.PubJS = al
			rec := h.recorded()
			h.session(sid, omni.ApproveAllowAll)
			fr := h.runner(sid, echo)
			h.complete(sid, "t1", "go")
			if al.lost.Load() != 1 {
				t.Fatalf("%d acks lost, want 1", al.lost.Load())
			}
			reqs := rec.requests()
			if len(reqs) != 2 {
				t.Fatalf("%d model requests, want 2", len(reqs))
			}
			var shape []string
			for _, m := range reqs[1] {
				shape = append(shape, m.Payload.Type+"/"+m.Payload.Role+"/"+m.Payload.ToolCallID)
			}
			if want := "text/user/ tool_call/assistant/call_1 tool_call_output/user/call_1"; strings.Join(shape, " ") != want {
				t.Fatalf("second request's context %q, want %q", strings.Join(shape, " "), want)
			}
			msgs := h.messages(sid)
			checkBrackets(t, msgs)
			if n := count(msgs, isType(omni.TypeRequestBegin, "")); n != 2 {
				t.Fatalf("%d request_begin, want 2%s", n, dump(msgs))
			}
			if n := count(msgs, func(m *omni.Message) bool { return m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleUser }); n != 1 {
				t.Fatalf("%d user inputs, want 1%s", n, dump(msgs))
			}
			if got := fr.ran(); len(got) != 1 {
				t.Fatalf("runs %v, want call_1 once", got)
			}
		})
	}
}

// twoTurns is a script with one tool call, then an answer that expects its
// output.
const twoTurns = `{"requests": [
  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "Done."}]}
]}`

// A tool job the stream refuses for a while (a leader election, here a
// stream at its limit) is published again until it is stored, instead of
// pairing the call at once with "tool not dispatched": the call runs once
// and its real output reaches the model.
func TestAToolJobTheStreamRefusesIsPublishedAgain(t *testing.T) {
	h := newHarness(t, twoTurns, nil)
	lb := h.logs()
	sid := "job1"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, echo)
	restore := h.refuse(omni.ToolsStream)
	done := h.run(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "the job refused and retried, or the call paired", func() bool {
		return lb.Contains("tool job not acknowledged; retrying") || index(h.messages(sid), isType(omni.TypeToolCallOutput, "call_1")) >= 0
	})
	restore()
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q%s", st, dump(h.messages(sid)))
	}
	msgs := h.messages(sid)
	out := msgs[index(msgs, isType(omni.TypeToolCallOutput, "call_1"))]
	if out.Payload.Output != "ran call_1" || out.Payload.Stop() != omni.StatusCompleted {
		t.Fatalf("call_1's output %q %q, want the runner's", out.Payload.Output, out.Payload.Stop())
	}
	if got := fr.ran(); len(got) != 1 {
		t.Fatalf("runs %v, want call_1 once", got)
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("model saw: %v", errs)
	}
}

// The stream stores a tool job but its ack is lost: the job is published
// again with the same Msg-Id, the stream drops the duplicate, and the call
// runs exactly once.
func TestAToolJobWhoseAckIsLostRunsOnce(t *testing.T) {
	h := newHarness(t, twoTurns, nil)
	sid := "job2"
	al := &ackLoss{JetStream: h.env.JS, lose: loseFirst(omni.ToolSubject(omni.DefaultPool, sid), "")}
	h.deps.JS = al
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, echo)
	h.complete(sid, "t1", "go")
	if al.lost.Load() != 1 {
		t.Fatalf("%d acks lost, want 1", al.lost.Load())
	}
	fr.mu.Lock()
	ids := append([]string(nil), fr.jobIDs...)
	fr.mu.Unlock()
	if want := sid + "/call_1/job"; len(ids) != 1 || ids[0] != want {
		t.Fatalf("jobs taken with Msg-Ids %q, want one %q", ids, want)
	}
}

// The stream refuses a call's approval decision itself (the request has
// ended, the call is stored): the Runner resumes its stream, reads the
// call back and publishes the decision again until it is stored; the job
// follows it, the call runs once and the decision is stored once, before
// the output.
func TestALostApprovalDecisionIsPublishedAgain(t *testing.T) {
	h := newHarness(t, twoTurns, nil)
	lb := h.logs()
	sid := "decide1"
	h.session(sid, omni.ApproveAlwaysAsk)
	fr := h.runner(sid, echo)
	done := h.run(sid, "t1", "go")
	bustest.Eventually(t, 10*time.Second, "call_1 pending after its request ended", func() bool {
		p := h.pending(sid)
		return len(p) == 1 && p[0] == "call_1" && len(requestEnds(h.messages(sid))) == 1
	})
	restore := h.refuse(omni.SessionsStream)
	if rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: "call_1", Decision: omni.DecisionAllow}); err != nil || !rep.OK {
		t.Fatalf("approve: %+v %v", rep, err)
	}
	bustest.Eventually(t, 10*time.Second, "the decision refused", func() bool {
		return lb.Contains("approval decision not stored")
	})
	if got := fr.ran(); len(got) != 0 {
		t.Fatalf("the call ran before its decision was stored: %v", got)
	}
	restore()
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q%s", st, dump(h.messages(sid)))
	}
	msgs := h.messages(sid)
	if n := count(msgs, isType(omni.TypeApprovalDecision, "call_1")); n != 1 {
		t.Fatalf("%d decisions for call_1, want 1%s", n, dump(msgs))
	}
	dec, out := index(msgs, isType(omni.TypeApprovalDecision, "call_1")), index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	if msgs[dec].Payload.Decision != omni.DecisionAllow || out < dec || msgs[out].Payload.Output != "ran call_1" {
		t.Fatalf("decision@%d %q, output@%d%s", dec, msgs[dec].Payload.Decision, out, dump(msgs))
	}
	if got := fr.ran(); len(got) != 1 {
		t.Fatalf("runs %v, want call_1 once", got)
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("model saw: %v", errs)
	}
}
