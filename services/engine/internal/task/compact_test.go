package task

import (
	"context"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
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
	rec := &recorder{Provider: h.prov}
	h.deps.Resolve = func(string) (model.Provider, model.Info, error) { return rec, h.prov.Info(), nil }
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
	if st := h.wait(h.run(sid, "t2", "next")); st != Completed {
		t.Fatalf("t2 status %q", st)
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("model saw: %v", errs)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.reqs) != 4 {
		for i, r := range rec.reqs {
			t.Logf("req %d: %q", i, shapes(r))
		}
		t.Fatalf("%d model requests, want 4", len(rec.reqs))
	}
	// The compaction request saw the old context and the prompt.
	creq := shapes(rec.reqs[1])
	if len(creq) != 3 || !strings.Contains(creq[0], `"hi"`) || !strings.Contains(creq[1], `"Hello."`) || !strings.Contains(creq[2], "Summarize the conversation") {
		t.Fatalf("compaction request context %q", creq)
	}
	// The next Task starts from the summary.
	next := shapes(rec.reqs[3])
	if len(next) != 2 || !strings.Contains(next[0], "the user greeted") || !strings.Contains(next[0], omni.TagContextSummary) ||
		next[1] != `text role=user call= name= content="next"` {
		t.Fatalf("next Task's context %q", next)
	}
}
