package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// floe sessions lists the recent Sessions newest first with their titles
// (the first prompt's line), states and Workspaces; --json gives the
// gateway's objects; -n keeps the newest.
func TestSessionsListsTitles(t *testing.T) {
	_, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [{"steps": [{"text": "ok"}]}], "after_last": "repeat_last"}`)
	for _, prompt := range []string{"Why is CI slow on main?\nmore detail", "Refactor the tracer"} {
		if out, errOut, code := runPiped(t, ws, env, prompt+"\n", "chat", "--model", model); code != 0 {
			t.Fatalf("chat: %d\n%s\n%s", code, out, errOut)
		}
	}
	out, errOut, code := runPiped(t, ws, env, "", "sessions")
	if code != 0 {
		t.Fatalf("floe sessions: %d\n%s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "TITLE") {
		t.Fatalf("floe sessions printed\n%s", out)
	}
	if !strings.Contains(lines[1], "Refactor the tracer") || !strings.Contains(lines[2], "Why is CI slow on main?") || strings.Contains(out, "more detail") {
		t.Fatalf("not the titles, newest first:\n%s", out)
	}
	for _, l := range lines[1:] {
		if !strings.Contains(l, "idle (completed)") || !strings.Contains(l, "ws") {
			t.Fatalf("no state or Workspace in %q", l)
		}
	}

	out, _, code = runPiped(t, ws, env, "", "sessions", "--json", "-n", "1")
	var list []client.Session
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 {
		t.Fatalf("--json: %v (status %d)\n%s", err, code, out)
	}
	if len(list) != 1 || list[0].Title != "Refactor the tracer" || list[0].Workspace != ws || list[0].State != "idle" {
		t.Fatalf("--json -n 1 gave %+v", list)
	}
	if _, err := time.Parse(time.RFC3339, list[0].CreatedAt); err != nil {
		t.Fatalf("createdAt %q: %v", list[0].CreatedAt, err)
	}
}

// Over HTTP, a Session whose model's provider has no key here is refused
// at once (400 model_unavailable naming the variable), not created to
// retry for a minute.
func TestServeRefusesAModelWithoutItsKey(t *testing.T) {
	home, ws, env := chatEnv(t)
	addr := freeAddr(t)
	serveEnv := append(append([]string{}, env...), "FLOE_HTTP_ADDR="+addr, "FLOE_NATS_LISTEN=off", "FLOE_HOME="+filepath.Join(home, "server"))
	serve := startPTY(t, ws, serveEnv, "serve")
	serve.expect("floe serve: http://" + addr)
	c := client.New("http://" + addr)
	_, err := c.CreateSession(t.Context(), client.CreateSession{Model: "openai:gpt-4o-mini", Workspace: ws})
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Code != omni.CodeModelUnavailable || !strings.Contains(ae.Message, "OPENAI_API_KEY") {
		t.Fatalf("create with openai and no key: %v, want 400 model_unavailable naming OPENAI_API_KEY", err)
	}
	if _, err := c.CreateSession(t.Context(), client.CreateSession{Model: "anthropic:claude-sonnet-4-5", Workspace: ws}); !client.IsCode(err, omni.CodeModelUnavailable) {
		t.Fatalf("create with anthropic and no key: %v", err)
	}
	if _, err := c.CreateSession(t.Context(), client.CreateSession{Workspace: ws}); err != nil {
		t.Fatalf("the default model: %v", err)
	}
	serve.cmd.Process.Signal(os.Interrupt)
	serve.wait()
}
