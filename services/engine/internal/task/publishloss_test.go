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

// lossyFirst plays a hand-made first request that loses part of its
// stream: "Hello " is stored, then FLOE_SESSIONS refuses every message
// (its max message size is cut to a few bytes) until the Task's stream has
// lost one, then takes them again; the rest of the answer streams into
// the failed producer. Later requests are the script's.
type lossyFirst struct {
	model.Provider
	h     *harness
	r     atomic.Pointer[Runner]
	calls atomic.Int32
}

func (l *lossyFirst) Stream(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	if l.calls.Add(1) > 1 {
		return l.Provider.Stream(ctx, req, emit)
	}
	var r *Runner
	for r = l.r.Load(); r == nil; r = l.r.Load() {
		time.Sleep(time.Millisecond)
	}
	if err := emit(model.Delta{Type: omni.TypeText, Text: "Hello "}); err != nil {
		return model.Result{}, err
	}
	if _, err := r.pub.Settle(ctx); err != nil {
		l.h.t.Errorf("settle before the loss: %v", err)
	}
	l.h.maxMsgSize(64)
	_ = emit(model.Delta{Type: omni.TypeText, Text: "wor"})
	t0 := time.Now()
	_, err := r.pub.Settle(ctx)
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
	h := newHarness(t, `{"requests": [{"steps": [{"text": "Hello world."}]}]}`,
		func(s *Settings) { s.PublishAckTimeout = time.Second })
	lp := &lossyFirst{Provider: h.prov, h: h}
	h.deps.Resolve = func(string) (model.Provider, model.Info, error) { return lp, h.prov.Info(), nil }
	sid := "loss1"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, echo)
	r, done := h.start(sid, "t1", "hi")
	lp.r.Store(r)
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	if got := requestEnds(msgs); len(got) != 2 || got[0] != (endWant{omni.StatusTimeout, 1, 20}) || got[1] != (endWant{omni.StatusCompleted, 2, 0}) {
		t.Fatalf("request_ends %v, want (timeout,1,20) (completed,2,0)%s", got, dump(msgs))
	}
	end1 := index(msgs, isType(omni.TypeRequestEnd, ""))
	if !strings.Contains(msgs[end1].Payload.ErrorMessage, "did not store") {
		t.Fatalf("first request_end error %q", msgs[end1].Payload.ErrorMessage)
	}
	first := msgs[:end1]
	// The failed attempt on the stream: begin, start "Hello ", the stop the
	// recovery added, the complete text of what was stored, its usage.
	var shape []string
	for _, m := range first[index(first, isType(omni.TypeRequestBegin, "")):] {
		p := m.Payload
		shape = append(shape, p.Type+"/"+p.EventType+"/"+p.Content()+"/"+p.StopReason)
	}
	want := []string{
		"request_begin///",
		"partial_text/start/Hello /",
		"partial_text/stop//",
		"text//Hello /failed",
		"token_usage///",
	}
	if strings.Join(shape, "\n") != strings.Join(want, "\n") {
		t.Fatalf("failed attempt:\n%s\nwant\n%s%s", strings.Join(shape, "\n"), strings.Join(want, "\n"), dump(msgs))
	}
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
