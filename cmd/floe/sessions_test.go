package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

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
