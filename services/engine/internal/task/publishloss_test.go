package task

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// lossyFirst plays a hand-made first request (play, helloLost when nil)
// that loses part of its stream; later requests are the script's.
type lossyFirst struct {
	model.Provider
	h     *harness
	r     atomic.Pointer[Runner]
	calls atomic.Int32
	play  func(ctx context.Context, l *lossyFirst, r *Runner, emit func(model.Delta) error) (model.Result, error)
}

func (l *lossyFirst) Stream(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	if l.calls.Add(1) > 1 {
		return l.Provider.Stream(ctx, req, emit)
	}
	var r *Runner
	for r = l.r.Load(); r == nil; r = l.r.Load() {
		time.Sleep(time.Millisecond)
	}
	if l.play != nil {
		return l.play(ctx, l, r, emit)
	}
	return l.helloLost(ctx, r, emit)
}

// helloLost: "Hello " is stored, then FLOE_SESSIONS refuses every message
// (its max message size is cut to a few bytes) until the Task's stream has
// lost one, then takes them again; the rest of the answer streams into
// the failed producer.
func (l *lossyFirst) helloLost(ctx context.Context, r *Runner, emit func(model.Delta) error) (model.Result, error) {
	if err := emit(model.Delta{Type: omni.TypeText, Text: "Hello "}); err != nil {
		return model.Result{}, err
	}
	if _, err := r.prod.pub.Settle(ctx); err != nil {
		l.h.t.Errorf("settle before the loss: %v", err)
	}
	l.h.maxMsgSize(64)
	_ = emit(model.Delta{Type: omni.TypeText, Text: "wor"})
	t0 := time.Now()
	_, err := r.prod.pub.Settle(ctx)
	l.h.t.Logf("loss after %v: %v", time.Since(t0), err)
	l.h.maxMsgSize(-1)
	if err == nil {
		l.h.t.Error("the stream stored a message bigger than its max message size")
	}
	_ = emit(model.Delta{Type: omni.TypeText, Text: "ld", End: true})
	_ = emit(model.Delta{Block: 1, Type: omni.TypeToolCall, Name: "exec_command", ToolCallID: "call_lost", Text: `{"cmd":"rm x"}`, End: true})
	return model.Result{StopReason: omni.StatusCompleted, Usage: omni.Usage{Output: 3, Total: 10}}, nil
}

// maxMsgSize sets FLOE_SESSIONS' max message size (-1: unlimited).
func (h *harness) maxMsgSize(n int32) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := h.env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		h.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgSize = n
	if _, err := h.env.JS.UpdateStream(ctx, cfg); err != nil {
		h.t.Fatalf("update stream: %v", err)
	}
}

// A message of a request that the stream did not store fails the attempt
// (timeout), although the model completed it: the attempt's open text is
// closed with what the stream holds (stop, then the complete text with
// stop_reason failed), its token_usage and request_end follow, the tool
// call whose message was lost is never decided or run, and the retry
// streams the whole answer again. Nothing published after the loss is on
// the stream.
func TestPublishLossFailsTheAttemptAndTheRetryRestores(t *testing.T) {
	_, fr, lp, msgs := lossyRun(t, "loss1", omni.ApproveAllowAll, nil, `{"requests": [{"steps": [{"text": "Hello world."}]}]}`)
	// The failed attempt on the stream: begin, start "Hello ", the stop the
	// recovery added, the complete text of what was stored, its usage.
	failedAttempt(t, msgs,
		"request_begin///",
		"partial_text/start/Hello /",
		"partial_text/stop//",
		"text//Hello /failed",
		"token_usage///",
	)
	if i := index(msgs, func(m *omni.Message) bool { return m.Payload.ToolCallID == "call_lost" }); i >= 0 {
		t.Fatalf("the lost call is on the stream%s", dump(msgs))
	}
	if len(fr.ran()) != 0 {
		t.Fatalf("the lost call ran: %v", fr.ran())
	}
	last := msgs[len(msgs)-3]
	if last.Payload.Type != omni.TypeText || last.Payload.Text != "Hello world." || last.Payload.Stop() != omni.StatusCompleted {
		t.Fatalf("retry's answer %+v%s", last.Payload, dump(msgs))
	}
	if n := lp.calls.Load(); n != 2 {
		t.Fatalf("model called %d times, want 2", n)
	}
}

// lossyRun runs a Task on a new harness whose first request plays play
// (helloLost when nil) and the rest script, checks that the first attempt
// failed for the loss and the retry completed, and returns the stream.
func lossyRun(t *testing.T, sid, mode string, play func(context.Context, *lossyFirst, *Runner, func(model.Delta) error) (model.Result, error), script string) (*harness, *fakeRunner, *lossyFirst, []omni.Message) {
	t.Helper()
	h := newHarness(t, script, func(s *Settings) { s.PublishAckTimeout = time.Second })
	lp := &lossyFirst{Provider: h.prov, h: h, play: play}
	h.deps.Resolve = func(string) (model.Provider, model.Info, error) { return lp, h.prov.Info(), nil }
	h.session(sid, mode)
	fr := h.runner(sid, echo)
	r, done := h.start(sid, "t1", "hi")
	lp.r.Store(r)
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q%s", st, dump(h.messages(sid)))
	}
	msgs := h.messages(sid)
	if got := requestEnds(msgs); len(got) != 2 || got[0] != (endWant{omni.StatusTimeout, 1, 20}) || got[1] != (endWant{omni.StatusCompleted, 2, 0}) {
		t.Fatalf("request_ends %v, want (timeout,1,20) (completed,2,0)%s", got, dump(msgs))
	}
	end1 := index(msgs, isType(omni.TypeRequestEnd, ""))
	if !strings.Contains(msgs[end1].Payload.ErrorMessage, "did not store") {
		t.Fatalf("first request_end error %q", msgs[end1].Payload.ErrorMessage)
	}
	return h, fr, lp, msgs
}

// failedAttempt checks the first attempt on the stream, from its
// request_begin to its request_end, as type/event/content/stop_reason.
func failedAttempt(t *testing.T, msgs []omni.Message, want ...string) {
	t.Helper()
	first := msgs[:index(msgs, isType(omni.TypeRequestEnd, ""))]
	var shape []string
	for _, m := range first[index(first, isType(omni.TypeRequestBegin, "")):] {
		p := m.Payload
		shape = append(shape, p.Type+"/"+p.EventType+"/"+p.Content()+"/"+p.StopReason)
	}
	if strings.Join(shape, "\n") != strings.Join(want, "\n") {
		t.Fatalf("failed attempt:\n%s\nwant\n%s%s", strings.Join(shape, "\n"), strings.Join(want, "\n"), dump(msgs))
	}
}

// A tool call whose start is stored but whose arguments the stream
// refuses (the batch carrying them fails: the publisher reports the
// attempt's messages lost from the begin on, the start with them): closing
// the attempt reads the start back and ends its segment (stop, then the
// tool_call with what was stored, failed), and the call, whose complete
// message was never stored, gets no decision and never runs. The retry
// answers. Under always-ask nobody has to answer for the lost call: its
// approval is withdrawn when the attempt finds it lost.
func TestAToolCallCutAfterItsStartIsClosedAndNeverRuns(t *testing.T) {
	for _, mode := range []string{omni.ApproveAllowAll, omni.ApproveAlwaysAsk} {
		t.Run(mode, func(t *testing.T) {
			h, fr, _, msgs := lossyRun(t, "loss2", mode, cutCall, `{"requests": [{"steps": [{"text": "Done."}]}]}`)
			failedAttempt(t, msgs,
				"request_begin///",
				`partial_tool_call/start/{"cmd":"/`,
				"partial_tool_call/stop//",
				`tool_call//{"cmd":"/failed`,
				"token_usage///",
			)
			checkBrackets(t, msgs)
			if i := index(msgs, isType(omni.TypeApprovalDecision, "call_cut")); i >= 0 {
				t.Fatalf("the cut call was decided%s", dump(msgs))
			}
			if len(fr.ran()) != 0 {
				t.Fatalf("the cut call ran: %v", fr.ran())
			}
			for _, ev := range h.serverEvents("loss2") {
				if ev.Type == omni.ServerApprovalRequest {
					t.Fatalf("asked about the lost call: %s", ev.ToolCall)
				}
			}
		})
	}
}

// cutCall streams a tool call whose start is stored and whose arguments
// are bigger than the stream takes for a moment.
func cutCall(ctx context.Context, l *lossyFirst, r *Runner, emit func(model.Delta) error) (model.Result, error) {
	l.h.maxMsgSize(1024)
	call := model.Delta{Type: omni.TypeToolCall, Name: "exec_command", ToolCallID: "call_cut", Text: `{"cmd":"`}
	if err := emit(call); err != nil {
		return model.Result{}, err
	}
	call.Text = strings.Repeat("x", 4096)
	_ = emit(call)
	if _, err := r.prod.pub.Settle(ctx); err == nil {
		l.h.t.Error("the stream stored a message bigger than its max message size")
	}
	l.h.maxMsgSize(-1)
	call.Text, call.End = `"}`, true
	_ = emit(call)
	return model.Result{StopReason: omni.StatusCompleted, Usage: omni.Usage{Output: 3, Total: 10}}, nil
}

// The stream refuses a completed request's token_usage and request_end,
// sent after every other message of the attempt was stored (its leader
// changed just then): they are published again (their Msg-Ids) until
// stored, before anything else of the Task, so the next request's
// request_begin never lands inside an open request (a kill9 failover run
// stored one after "batch message 1 ack timeout"). Each is stored once;
// the call ran once and the Task completes.
func TestALostRequestEndIsStoredBeforeTheNextBegin(t *testing.T) {
	const sid = "endlost"
	h := newHarness(t, `{"requests": [{"expect_tool_outputs": ["call_1"], "steps": [{"text": "Done."}]}]}`,
		func(s *Settings) { s.PublishSyncDeadline = 300 * time.Millisecond })
	restored := make(chan bool, 1)
	play := func(ctx context.Context, l *lossyFirst, r *Runner, emit func(model.Delta) error) (model.Result, error) {
		if err := emit(model.Delta{Type: omni.TypeToolCall, Name: "exec_command", ToolCallID: "call_1", Text: `{"cmd":"make"}`, End: true}); err != nil {
			return model.Result{}, err
		}
		// The call's decision and output are stored before the cut: only
		// the request's end meets it.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			msgs := l.h.messages(sid)
			if index(msgs, isType(omni.TypeApprovalDecision, "call_1")) >= 0 && index(msgs, isType(omni.TypeToolCallOutput, "call_1")) >= 0 {
				break
			}
			if time.Now().After(deadline) {
				l.h.t.Errorf("call_1 not decided and answered%s", dump(msgs))
				break
			}
		}
		if _, err := r.prod.pub.Settle(ctx); err != nil {
			l.h.t.Errorf("settle before the cut: %v", err)
		}
		losses := r.prod.pub.Token() >> 1
		restore := l.h.refuse(omni.SessionsStream)
		go func() {
			// The stream takes messages again once the Task's stream
			// counted the end lost.
			deadline := time.Now().Add(30 * time.Second)
			for r.prod.pub.Token()>>1 == losses && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			restore()
			restored <- r.prod.pub.Token()>>1 > losses
		}()
		return model.Result{StopReason: omni.StatusCompleted, Usage: omni.Usage{Output: 3, Total: 10}}, nil
	}
	lp := &lossyFirst{Provider: h.prov, h: h, play: play}
	h.deps.Resolve = func(string) (model.Provider, model.Info, error) { return lp, h.prov.Info(), nil }
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, echo)
	r, done := h.start(sid, "t1", "go")
	lp.r.Store(r)
	st := h.wait(done)
	if !<-restored {
		t.Fatal("the stream never refused the request's end")
	}
	msgs := h.messages(sid)
	if st != Completed {
		t.Fatalf("status %q%s", st, dump(msgs))
	}
	checkBrackets(t, msgs)
	if got := requestEnds(msgs); len(got) != 2 || got[0] != (endWant{omni.StatusCompleted, 0, 0}) || got[1] != (endWant{omni.StatusCompleted, 0, 0}) {
		t.Fatalf("request_ends %v, want two completed%s", got, dump(msgs))
	}
	if n := count(msgs, isType(omni.TypeTokenUsage, "")); n != 2 {
		t.Fatalf("%d token_usage, want 2%s", n, dump(msgs))
	}
	if got := fr.ran(); len(got) != 1 {
		t.Fatalf("runs %v, want call_1 once", got)
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("model saw: %v", errs)
	}
}
