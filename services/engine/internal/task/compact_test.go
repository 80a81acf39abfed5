package task

import (
	"context"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// classMessages reads the Session's messages of the given classes in
// order (server events skipped).
func (h *harness) classMessages(sid string, classes []string) []omni.Message {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []omni.Message
	err := bus.FollowUntil(ctx, h.env.JS, sid, classes, 0, true, func(sm bus.StreamMsg) error {
		if sm.Class == omni.ClassServer {
			return nil // server events are not Floe messages
		}
		m, err := omni.Decode(sm.Data)
		if err == nil {
			out = append(out, m)
		}
		return err
	})
	if err != nil {
		h.t.Fatalf("read stream: %v", err)
	}
	return out
}

// A turn-count compaction at the Task boundary: its first request fails
// and is retried on the ladder, the summary completes it, the Session gets
// a new head, and the next Task's model context is the summary and its
// input only. The compaction prompt and its requests are Trace only.
func TestCompactionAtTheTaskBoundaryRetriesAndStartsANewContext(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"text": "Hello."}]},
	  {"steps": [{"error": {"status": "timeout", "message": "slow"}}]},
	  {"steps": [{"text": "[summary]the user greeted[/summary]"}]},
	  {"expect_last_user": "next", "steps": [{"text": "Next."}]}
	]}`, nil)
	rec := h.recorded()
	sid := "compact1"
	h.session(sid, omni.ApproveAllowAll)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.env.Sessions.Update(ctx, sid, func(r *omni.SessionRecord) error {
		r.Compaction = omni.CompactionConfig{MaxSessionTurns: 1, Mode: omni.ModeSummarize}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st := h.wait(h.run(sid, "t1", "hi")); st != Completed {
		t.Fatalf("t1 status %q", st)
	}
	msgs := h.messages(sid)
	begin := index(msgs, isType(omni.TypeCompactionBegin, ""))
	end := index(msgs, isType(omni.TypeCompactionEnd, ""))
	taskEnd := index(msgs, isType(omni.TypeRequestEnd, ""))
	if begin < 0 || end < begin || taskEnd > begin {
		t.Fatalf("compaction_begin@%d end@%d after the Task's request_end@%d?%s", begin, end, taskEnd, dump(msgs))
	}
	if p := msgs[begin].Payload; p.Reason != omni.CompactTurns || p.Mode != omni.ModeSummarize {
		t.Fatalf("compaction_begin %+v", p)
	}
	if p := msgs[end].Payload; p.Status != omni.StatusCompleted || p.Attempt != 2 {
		t.Fatalf("compaction_end status %q attempt %d, want completed 2%s", p.Status, p.Attempt, dump(msgs))
	}
	// Between begin and end: the compaction's two request brackets.
	if got := requestEnds(msgs[begin:end]); len(got) != 2 || got[0] != (endWant{omni.StatusTimeout, 1, 20}) || got[1].status != omni.StatusCompleted {
		t.Fatalf("compaction request_ends %v%s", got, dump(msgs))
	}
	// After it: a new head, then the summary.
	tail := msgs[end+1:]
	if len(tail) != 3 || !tail[0].IsSessionMeta() || tail[1].Payload.Type != omni.TypeToolListReady ||
		!strings.Contains(tail[2].Payload.Text, "the user greeted") {
		t.Fatalf("after compaction_end:%s", dump(tail))
	}
	// Clients see the compaction events, never its prompt or summary.
	for _, m := range h.classMessages(sid, omni.ClientClasses) {
		if c := m.Payload.Content(); strings.Contains(c, CompactionPrompt) || strings.Contains(c, "the user greeted") {
			t.Fatalf("client class carries compaction text %q", c)
		}
	}

	// No further compaction: t2 is only to see the new context.
	if _, err := h.env.Sessions.Update(ctx, sid, func(r *omni.SessionRecord) error {
		r.Compaction = omni.CompactionConfig{}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	h.complete(sid, "t2", "next")
	reqs := rec.requests()
	if len(reqs) != 4 {
		for i, r := range reqs {
			t.Logf("req %d: %q", i, shapes(r))
		}
		t.Fatalf("%d model requests, want 4", len(reqs))
	}
	// The compaction request saw the old context and the prompt.
	creq := shapes(reqs[1])
	if len(creq) != 3 || !strings.Contains(creq[0], `"hi"`) || !strings.Contains(creq[1], `"Hello."`) || !strings.Contains(creq[2], "Summarize the conversation") {
		t.Fatalf("compaction request context %q", creq)
	}
	// The next Task starts from the summary.
	next := shapes(reqs[3])
	if len(next) != 2 || !strings.Contains(next[0], "the user greeted") || !strings.Contains(next[0], omni.TagContextSummary) ||
		next[1] != `text role=user call= name= content="next"` {
		t.Fatalf("next Task's context %q", next)
	}
}

// compactionEnds returns the compaction_end payloads in stream order.
func compactionEnds(msgs []omni.Message) []omni.Payload {
	var out []omni.Payload
	for _, m := range msgs {
		if m.Payload.Type == omni.TypeCompactionEnd {
			out = append(out, m.Payload)
		}
	}
	return out
}

// A compaction whose every request fails climbs the whole ladder (the
// requests' ladder: same attempts and waits, the last with no wait), ends
// failed with its last attempt and error, keeps the old context (no new
// head, no summary) and leaves the Task's own outcome alone; the next
// Task's context is still the old one.
func TestCompactionThatFailsToTheEndKeepsTheOldContext(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"text": "Hello."}]},
	  {"steps": [{"error": {"status": "timeout", "message": "slow"}}]},
	  {"steps": [{"error": {"status": "failed", "message": "down"}}]},
	  {"steps": [{"error": {"status": "failed", "message": "still down"}}]},
	  {"expect_last_user": "next", "steps": [{"text": "Next."}]}
	]}`, func(s *Settings) { s.RetryMax = 2 })
	rec := h.recorded()
	sid := "compact2"
	h.compactingSession(sid)
	if st := h.wait(h.run(sid, "t1", "hi")); st != Completed {
		t.Fatalf("t1 status %q, want the Task's own outcome", st)
	}
	msgs := h.messages(sid)
	begin := index(msgs, isType(omni.TypeCompactionBegin, ""))
	ends := compactionEnds(msgs)
	if begin < 0 || len(ends) != 1 {
		t.Fatalf("compaction begin@%d ends %d%s", begin, len(ends), dump(msgs))
	}
	if p := ends[0]; p.Status != omni.StatusFailed || p.Attempt != 3 || !strings.Contains(p.ErrorMessage, "still down") {
		t.Fatalf("compaction_end status %q attempt %d error %q, want failed 3 \"still down\"", p.Status, p.Attempt, p.ErrorMessage)
	}
	end := index(msgs, isType(omni.TypeCompactionEnd, ""))
	want := []endWant{{omni.StatusTimeout, 1, 20}, {omni.StatusFailed, 2, 40}, {omni.StatusFailed, 3, 0}}
	if got := requestEnds(msgs[begin:end]); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("compaction request_ends %v, want %v%s", got, want, dump(msgs))
	}
	if tail := msgs[end+1:]; len(tail) != 0 {
		t.Fatalf("after a failed compaction_end:%s", dump(tail))
	}

	h.update(sid, func(r *omni.SessionRecord) { r.Compaction = omni.CompactionConfig{} })
	h.complete(sid, "t2", "next")
	reqs := rec.requests()
	next := shapes(reqs[len(reqs)-1])
	if len(next) != 3 || !strings.Contains(next[0], `"hi"`) || !strings.Contains(next[1], `"Hello."`) || !strings.Contains(next[2], `"next"`) {
		t.Fatalf("next Task's context %q, want the old context and its input", next)
	}
}

// A compaction answer that cannot be used (an empty summary) fails the
// compaction at once, without a retry; an abort while a compaction waits
// to retry ends it aborted, and the Task with it.
func TestCompactionUnusableAnswerAndAbortDuringItsBackoff(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"text": "Hello."}]},
	  {"steps": [{"text": "[summary] [/summary]"}]}
	]}`, nil)
	sid := "compact3"
	h.compactingSession(sid)
	if st := h.wait(h.run(sid, "t1", "hi")); st != Completed {
		t.Fatalf("t1 status %q", st)
	}
	msgs := h.messages(sid)
	ends := compactionEnds(msgs)
	if len(ends) != 1 || ends[0].Status != omni.StatusFailed || ends[0].Attempt != 1 || ends[0].ErrorMessage != "the compaction request produced an empty summary" {
		t.Fatalf("compaction_end %+v%s", ends, dump(msgs))
	}
	if got := requestEnds(msgs[index(msgs, isType(omni.TypeCompactionBegin, "")):]); len(got) != 1 || got[0] != (endWant{omni.StatusCompleted, 1, 0}) {
		t.Fatalf("compaction request_ends %v", got)
	}

	h2 := newHarness(t, `{"requests": [
	  {"steps": [{"text": "Hello."}]},
	  {"steps": [{"error": {"status": "failed", "message": "down"}}]},
	  {"steps": [{"text": "never"}]}
	]}`, func(s *Settings) { s.RetryBase, s.RetryCap = time.Minute, time.Minute })
	sid = "compact4"
	h2.compactingSession(sid)
	done := h2.run(sid, "t1", "hi")
	bustest.Eventually(t, 10*time.Second, "the compaction's failed request", func() bool {
		msgs := h2.messages(sid)
		b := index(msgs, isType(omni.TypeCompactionBegin, ""))
		return b >= 0 && len(requestEnds(msgs[b:])) == 1
	})
	msgs = h2.abort(sid, done)
	b := index(msgs, isType(omni.TypeCompactionBegin, ""))
	if got := requestEnds(msgs[b:]); len(got) != 1 || got[0] != (endWant{omni.StatusFailed, 1, 60000}) {
		t.Fatalf("compaction request_ends %v%s", got, dump(msgs))
	}
	ends = compactionEnds(msgs)
	if len(ends) != 1 || ends[0].Status != omni.StatusAborted || ends[0].Attempt != 1 || !strings.Contains(ends[0].ErrorMessage, "down") {
		t.Fatalf("compaction_end %+v%s", ends, dump(msgs))
	}
	if last := msgs[len(msgs)-1]; last.Payload.Type != omni.TypeAbort {
		t.Fatalf("last message %s, want abort%s", last.Payload.Type, dump(msgs))
	}
	if n := h2.prov.Calls(sid); n != 2 {
		t.Fatalf("model called %d times, want 2", n)
	}
}

// compactingRun runs Task t1 ("build it") to completion on a new
// allow-all Session compacting by cfg, with a runner answering every
// call, and returns the model's requests and the stream.
func (h *harness) compactingRun(sid string, cfg omni.CompactionConfig) (*recorder, []omni.Message) {
	h.t.Helper()
	rec := h.recorded()
	h.sessionWith(sid, omni.ApproveAllowAll, func(r *omni.SessionRecord) { r.Compaction = cfg })
	h.runner(sid, echo)
	h.complete(sid, "t1", "build it")
	return rec, h.messages(sid)
}

// A context-length compaction inside a Task: the first request used
// exactly the Session's max_context_length, so before the next request
// the context (input, tool call and output) is summarized; that request
// starts from the summary alone, and the Task ends without a second
// compaction (the new context's last request is small).
func TestContextLengthCompactsBeforeTheNextRequest(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"usage": {"total": 100}, "steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"usage": {"total": 50}, "steps": [{"text": "[summary]make ran[/summary]"}]},
	  {"usage": {"total": 10}, "steps": [{"text": "Done."}]}
	]}`, nil)
	rec, msgs := h.compactingRun("compact5", omni.CompactionConfig{MaxContextLength: 100, Mode: omni.ModeSummarize})
	begin := index(msgs, isType(omni.TypeCompactionBegin, ""))
	out := index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	if begin < 0 || begin < out || count(msgs, isType(omni.TypeCompactionBegin, "")) != 1 {
		t.Fatalf("compaction_begin@%d, want one after call_1's output@%d%s", begin, out, dump(msgs))
	}
	if p := msgs[begin].Payload; p.Reason != omni.CompactContext || p.Mode != omni.ModeSummarize {
		t.Fatalf("compaction_begin reason %q mode %q", p.Reason, p.Mode)
	}
	if ends := compactionEnds(msgs); len(ends) != 1 || ends[0].Status != omni.StatusCompleted {
		t.Fatalf("compaction_end %+v%s", ends, dump(msgs))
	}
	// The Task's last request comes after the new head.
	end := index(msgs, isType(omni.TypeCompactionEnd, ""))
	if tail := msgs[end+1:]; len(tail) < 3 || !tail[0].IsSessionMeta() || tail[1].Payload.Type != omni.TypeToolListReady ||
		tail[len(tail)-1].Payload.Type != omni.TypeRequestEnd {
		t.Fatalf("after compaction_end:%s", dump(tail))
	}
	reqs := rec.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d model requests, want 3", len(reqs))
	}
	if c := shapes(reqs[1]); len(c) != 4 || !strings.Contains(c[0], `"build it"`) || !strings.Contains(c[2], "ran call_1") || !strings.Contains(c[3], "Summarize") {
		t.Fatalf("compaction request context %q", c)
	}
	if c := shapes(reqs[2]); len(c) != 1 || !strings.Contains(c[0], omni.TagContextSummary) || !strings.Contains(c[0], "make ran") {
		t.Fatalf("the request after the compaction: context %q, want the summary alone", c)
	}
}

// Discard mode never compacts inside a Task (it would drop the Task's own
// work): the turn-count trigger due after the first turn waits for the
// Task boundary, where the context is dropped without a model request and
// a new head starts; the next Task's context is its input alone.
func TestDiscardCompactionWaitsForTheBoundaryAndDropsTheContext(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "make"}}}]},
	  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "Built."}]},
	  {"expect_last_user": "next", "steps": [{"text": "Next."}]}
	]}`, nil)
	sid := "compact6"
	rec, msgs := h.compactingRun(sid, omni.CompactionConfig{MaxSessionTurns: 1, Mode: omni.ModeDiscard})
	begin := index(msgs, isType(omni.TypeCompactionBegin, ""))
	lastEnd := -1
	for i := range msgs {
		if msgs[i].Payload.Type == omni.TypeRequestEnd {
			lastEnd = i
		}
	}
	if begin < 0 || begin < lastEnd || count(msgs, isType(omni.TypeCompactionBegin, "")) != 1 {
		t.Fatalf("compaction_begin@%d, want one after the Task's last request_end@%d%s", begin, lastEnd, dump(msgs))
	}
	if p := msgs[begin].Payload; p.Reason != omni.CompactTurns || p.Mode != omni.ModeDiscard {
		t.Fatalf("compaction_begin reason %q mode %q", p.Reason, p.Mode)
	}
	// No request inside it; then the new head and nothing else.
	if tail := msgs[begin+1:]; len(tail) != 3 || tail[0].Payload.Type != omni.TypeCompactionEnd || tail[0].Payload.Status != omni.StatusCompleted ||
		!tail[1].IsSessionMeta() || tail[2].Payload.Type != omni.TypeToolListReady {
		t.Fatalf("after compaction_begin:%s", dump(tail))
	}
	if c := shapes(rec.requests()[1]); len(c) != 3 {
		t.Fatalf("the Task's second request: context %q, want the whole Task", c)
	}
	h.update(sid, func(r *omni.SessionRecord) { r.Compaction = omni.CompactionConfig{} })
	h.complete(sid, "t2", "next")
	reqs := rec.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d model requests, want 3 (discard asks the model nothing)", len(reqs))
	}
	if c := shapes(reqs[2]); len(c) != 1 || c[0] != `text role=user call= name= content="next"` {
		t.Fatalf("next Task's context %q, want its input alone", c)
	}
}
