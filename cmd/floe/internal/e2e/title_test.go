package e2e

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
	"floe.dev/services/gateway/client"
)

// titleRun creates a Session through the gateway and runs Tasks with the
// prompts, each to completed.
func titleRun(t *testing.T, e *env, c *client.Client, prompts ...string) string {
	t.Helper()
	s, err := c.CreateSession(ctxT(t), client.CreateSession{Model: rcModel, Workspace: e.ws})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range prompts {
		taskID, err := c.SubmitTask(ctxT(t), s.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: p}}})
		if err != nil {
			t.Fatal(err)
		}
		if rs, status := e.wait(s.ID, taskID); status != omni.StatusCompleted {
			t.Fatalf("Task %q: %s; stream %v", p, status, labels(rs, noPartials))
		}
	}
	return s.ID
}

// After the first Task the engine asks the model (a real HTTP server
// speaking Chat Completions) for a title: one extra request, no tools,
// no system prompt, the prompt and answer quoted; its answer replaces the
// prompt's title and nothing of it reaches the stream or the Trace.
func TestModelTitleAfterTheFirstTask(t *testing.T) {
	f := rcNewFake(t, rcAnswer("The CI runs every suite twice."), rcAnswer("second answer"))
	e := rcEnv(t, f, nil)
	c := e.gw(t, nil)
	sid := titleRun(t, e, c, "Why is the CI slow on main?")
	eventually(t, 30*time.Second, "the model's title", func() bool {
		s, err := c.GetSession(ctxT(t), sid)
		return err == nil && s.Title == rcTitle
	})
	titles := f.titleRequests()
	if len(titles) != 1 || f.requests() != 1 {
		t.Fatalf("%d title requests, %d others; want 1 and 1", len(titles), f.requests())
	}
	var body struct {
		Tools    []json.RawMessage `json:"tools"`
		Messages []rcSentMessage   `json:"messages"`
	}
	if err := json.Unmarshal(titles[0], &body); err != nil || len(body.Tools) != 0 || len(body.Messages) != 1 || body.Messages[0].Role != "user" {
		t.Fatalf("title request %s (%v)", titles[0], err)
	}
	text := body.Messages[0].text()
	if !strings.HasPrefix(text, engine.TitleInstruction) || !strings.Contains(text, "[User]\nWhy is the CI slow on main?") ||
		!strings.Contains(text, "[Assistant]\nThe CI runs every suite twice.") {
		t.Fatalf("title prompt %q", text)
	}
	// The second Task is the fake's second reply: the title request
	// took none of the script.
	taskID, err := c.SubmitTask(ctxT(t), sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "and now?"}}})
	if err != nil {
		t.Fatal(err)
	}
	if rs, status := e.wait(sid, taskID); status != omni.StatusCompleted {
		t.Fatalf("second Task: %s; stream %v", status, labels(rs, noPartials))
	}
	e.lcTraced(sid)
	files, _ := trace.Files(e.home, sid)
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), rcTitle) || strings.Contains(string(b), engine.TitleInstruction) {
			t.Fatalf("the title request is in the Trace %s", p)
		}
	}
	if s, _ := c.GetSession(ctxT(t), sid); s.Title != rcTitle {
		t.Fatalf("title %q after the second Task", s.Title)
	}
}

// A failing title request (HTTP 500, then nothing) leaves the prompt's
// title, and the Session goes on as if it had not been made.
func TestFailingModelTitleChangesNothing(t *testing.T) {
	f := rcNewFake(t, rcAnswer("first answer"), rcAnswer("second answer"))
	f.titleReply = rcReject(500, `{"error":{"message":"boom","type":"server_error"}}`)
	e := rcEnv(t, f, nil)
	c := e.gw(t, nil)
	sid := titleRun(t, e, c, "Why is the CI slow on main?")
	eventually(t, 30*time.Second, "the title request", func() bool { return len(f.titleRequests()) == 1 })
	taskID, err := c.SubmitTask(ctxT(t), sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "and now?"}}})
	if err != nil {
		t.Fatal(err)
	}
	rs, status := e.wait(sid, taskID)
	if status != omni.StatusCompleted {
		t.Fatalf("second Task: %s; stream %v", status, labels(rs, noPartials))
	}
	if f.requests() != 2 {
		t.Fatalf("%d requests, want 2", f.requests())
	}
	s, err := c.GetSession(ctxT(t), sid)
	if err != nil || s.Title != "Why is the CI slow on main?" || s.State != omni.StateIdle {
		t.Fatalf("session %+v (%v)", s, err)
	}
	if got := f.body(1).Messages; len(got) < 3 || got[len(got)-1].text() != "and now?" {
		t.Fatalf("the second request's messages: %+v", got)
	}
}
