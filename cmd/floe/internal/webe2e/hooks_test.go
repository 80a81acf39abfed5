package webe2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"floe.dev/services/gateway/client"
)

// A call a pre_tool_use hook denies (a command hook of `floe serve`,
// FLOE_HOOKS, run confined like a tool) shows on its card which hook
// denied it and why (protocol.md §7 "Hooks"), in the live view and after a
// reload from history; nothing ran.
func TestHookDeniedCallCardSaysWhichHookAndWhy(t *testing.T) {
	dir := t.TempDir()
	hook := filepath.Join(dir, "no-push-main.sh")
	if err := os.WriteFile(hook, []byte(`#!/bin/sh
in=$(cat)
case "$in" in
*"push origin main"*) echo '{"decision":"deny","reason":"pushes to main are not allowed"}' ;;
esac
`), 0o755); err != nil {
		t.Fatal(err)
	}
	hooks, _ := json.Marshal(obj{"hooks": obj{"pre_tool_use": []obj{{"name": "no-push-main", "command": hook, "match": "exec_command"}}}})
	hooksFile := filepath.Join(dir, "hooks.json")
	if err := os.WriteFile(hooksFile, hooks, 0o644); err != nil {
		t.Fatal(err)
	}
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"tool_call": obj{"name": "exec_command", "id": "call_push",
			"arguments": obj{"description": "push", "cmd": "touch pushed && git push origin main"}}}}},
		obj{"expect_tool_outputs": []string{"call_push"}, "steps": []any{obj{"text": "The push was refused."}}},
	}}, "FLOE_HOOKS="+hooksFile)
	ws := filepath.Join(s.dir, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	sid := s.session(t, "", client.CreateSession{Workspace: ws})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.send("push it")
	card := `document.querySelector('li[data-tool-call-id="call_push"]')`
	check := func(when string) {
		t.Helper()
		tb.until("the answer after the denied call ("+when+")", `[...document.querySelectorAll('#transcript li')].some((li) => li.textContent.includes('The push was refused.'))`)
		tb.until("the card's hook denial ("+when+")", card+`?.querySelector('.hook-denial')?.textContent === 'Denied by the no-push-main hook: pushes to main are not allowed'`)
		if got := eval[string](tb, card+`.querySelector('summary .decision').textContent`); got != "denied by the no-push-main hook" {
			t.Errorf("%s: the card's decision reads %q", when, got)
		}
		if !eval[bool](tb, card+`.querySelector('.hook-denial').offsetParent !== null`) {
			t.Errorf("%s: the hook's reason is not visible on the card", when)
		}
		if got := eval[string](tb, card+`.dataset.status`); got != "denied" {
			t.Errorf("%s: card status %q, want denied", when, got)
		}
	}
	check("live")
	tb.reload()
	check("after a reload")
	if _, err := os.Stat(filepath.Join(ws, "pushed")); err == nil {
		t.Error("the denied command ran")
	}
	tb.screenshot("hook-denied-card")
}
