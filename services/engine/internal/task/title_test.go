package task

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// recordingProvider passes requests to a provider and keeps them.
type recordingProvider struct {
	model.Provider
	mu   sync.Mutex
	reqs []model.Request
	// onTitle, if set, runs when a title request arrives.
	onTitle func()
}

func (p *recordingProvider) Stream(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	p.mu.Lock()
	p.reqs = append(p.reqs, *req)
	p.mu.Unlock()
	if req.Purpose == model.PurposeTitle && p.onTitle != nil {
		p.onTitle()
	}
	return p.Provider.Stream(ctx, req, emit)
}

func (p *recordingProvider) requests() []model.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reqs)
}

// record wraps the harness's provider in a recordingProvider.
func (h *harness) recordRequests() *recordingProvider {
	rp := &recordingProvider{Provider: h.prov}
	h.deps.Resolve = func(string) (model.Provider, model.Info, error) { return rp, h.prov.Info(), nil }
	return rp
}

// completeNamed runs a Task to the end as complete does, then what the
// engine runs after it: NameSession.
func (h *harness) completeNamed(sid, taskID, text string) {
	h.t.Helper()
	r, done := h.start(sid, taskID, text)
	st := h.wait(done)
	if st != Completed {
		h.t.Fatalf("%s status %q%s", taskID, st, dump(h.messages(sid)))
	}
	r.NameSession(h.t.Context(), st)
}

const titledScript = `{"title": "\"Greeting the user.\"", "requests": [
  {"steps": [{"text": "Hello! How can I help?"}]},
  {"steps": [{"text": "Second answer."}]}
]}`

func promptTitled(r *omni.SessionRecord) {
	r.Title, r.TitleSource = "hello there, model", omni.TitleFromPrompt
}

// After the first completed Task the model's title replaces the prompt's:
// one extra request with purpose title, no tools, no system prompt, the
// user's text and the answer quoted; the scripted model answers it without
// consuming its script, and nothing of it reaches the stream.
func TestModelTitleReplacesThePromptTitle(t *testing.T) {
	h := newHarness(t, titledScript, nil)
	rp := h.recordRequests()
	sid := "titled"
	h.sessionWith(sid, omni.ApproveAllowAll, promptTitled)
	h.completeNamed(sid, "t1", "hello there, model")
	rec := h.record(sid)
	if rec.Title != "Greeting the user" || rec.TitleSource != omni.TitleFromModel {
		t.Fatalf("title %q source %q", rec.Title, rec.TitleSource)
	}
	reqs := rp.requests()
	if len(reqs) != 2 || reqs[0].Purpose != "" || reqs[1].Purpose != model.PurposeTitle {
		t.Fatalf("requests %+v", reqs)
	}
	tr := reqs[1]
	if len(tr.Tools) != 0 || tr.SystemPrompt != "" || tr.ThinkingLevel != "" || len(tr.Messages) != 1 {
		t.Fatalf("title request %+v", tr)
	}
	text := tr.Messages[0].Payload.Text
	if !strings.Contains(text, "[User]\nhello there, model") || !strings.Contains(text, "[Assistant]\nHello! How can I help?") {
		t.Fatalf("title prompt %q", text)
	}
	if got := model.TitleMaterial(&tr); got != "hello there, model" {
		t.Fatalf("material %q", got)
	}
	if n := h.prov.Calls(sid); n != 1 {
		t.Fatalf("script calls %d, want 1: the title request consumed the script", n)
	}
	for _, m := range h.messages(sid) {
		if strings.Contains(m.Payload.Text, "Greeting") || strings.Contains(m.Payload.Text, "[User]") {
			t.Fatalf("the title request reached the stream: %+v", m.Payload)
		}
	}
	// Titled by the model: the next Task asks no more, and plays the
	// script's second entry.
	h.completeNamed(sid, "t2", "again")
	if n := len(rp.requests()); n != 3 {
		t.Fatalf("%d requests after the second Task, want 3", n)
	}
	if rec := h.record(sid); rec.Title != "Greeting the user" {
		t.Fatalf("title %q after the second Task", rec.Title)
	}
}

// A person's title is never replaced: no title request is made.
func TestModelTitleLeavesAPersonsTitle(t *testing.T) {
	h := newHarness(t, titledScript, nil)
	rp := h.recordRequests()
	sid := "renamed"
	h.sessionWith(sid, omni.ApproveAllowAll, func(r *omni.SessionRecord) { r.Title = "My own name" })
	h.completeNamed(sid, "t1", "hello")
	if rec := h.record(sid); rec.Title != "My own name" || rec.TitleSource != "" {
		t.Fatalf("title %q source %q", rec.Title, rec.TitleSource)
	}
	if n := len(rp.requests()); n != 1 {
		t.Fatalf("%d requests, want 1 (no title request)", n)
	}
}

// A rename that lands while the title request runs wins.
func TestRenameDuringTitleRequestWins(t *testing.T) {
	h := newHarness(t, titledScript, nil)
	rp := h.recordRequests()
	sid := "racing"
	h.sessionWith(sid, omni.ApproveAllowAll, promptTitled)
	rp.onTitle = func() {
		h.update(sid, func(r *omni.SessionRecord) { r.Title, r.TitleSource = "Renamed by a person", "" })
	}
	h.completeNamed(sid, "t1", "hello there, model")
	if rec := h.record(sid); rec.Title != "Renamed by a person" || rec.TitleSource != "" {
		t.Fatalf("title %q source %q", rec.Title, rec.TitleSource)
	}
	if n := len(rp.requests()); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
}

// A failing title request changes nothing: the prompt's title stays, the
// Task's outcome and stream are as without it, and the next completed
// Task asks again.
func TestFailingTitleRequestChangesNothing(t *testing.T) {
	script := `{"requests": [{"steps": [{"text": "one"}]}, {"steps": [{"text": "two"}]}]}`
	h := newHarness(t, script, nil)
	rp := h.recordRequests()
	sid := "untitled"
	h.sessionWith(sid, omni.ApproveAllowAll, promptTitled)
	h.completeNamed(sid, "t1", "hello there, model")
	before := h.record(sid)
	if before.Title != "hello there, model" || before.TitleSource != omni.TitleFromPrompt || before.LastStatus != Completed {
		t.Fatalf("record %+v", before)
	}
	msgs := h.messages(sid)
	var texts []string
	for _, m := range msgs {
		if m.Payload.Type == omni.TypeText {
			texts = append(texts, m.Payload.Role+":"+m.Payload.Text)
		}
	}
	if !slices.Equal(texts, []string{"user:hello there, model", "assistant:one"}) {
		t.Fatalf("texts %q%s", texts, dump(msgs))
	}
	h.completeNamed(sid, "t2", "again")
	reqs := rp.requests()
	var purposes []string
	for _, r := range reqs {
		purposes = append(purposes, r.Purpose)
	}
	if !slices.Equal(purposes, []string{"", model.PurposeTitle, "", model.PurposeTitle}) {
		t.Fatalf("purposes %q", purposes)
	}
	if n := h.prov.Calls(sid); n != 2 {
		t.Fatalf("script calls %d, want 2", n)
	}
}

func TestSanitizeTitle(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Fix the login bug", "Fix the login bug"},
		{`  "Fix the login bug."  `, "Fix the login bug"},
		{"<think>hmm, what</think>\n**Title: Fix the login bug**", "Fix the login bug"},
		{"「修复登录错误」。", "修复登录错误"},
		{"Title:\n  Rename   the\tfiles!", "Rename the files"},
		{"<think>never closed", ""},
		{`"..."`, ""},
		{strings.Repeat("word ", 30), strings.TrimSpace(strings.Repeat("word ", 12)) + "…"},
	} {
		if got := sanitizeTitle(c.in); got != c.want {
			t.Errorf("sanitizeTitle(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
