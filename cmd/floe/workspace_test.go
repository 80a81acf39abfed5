package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An explicit --workspace anywhere the user can reach is accepted by the
// local commands, outside FLOE_WORKSPACE_ROOTS too (those guard a server's
// HTTP clients); "/" is still refused.
func TestLocalCommandsAcceptAnExplicitWorkspace(t *testing.T) {
	home, ws, env := chatEnv(t)
	outside := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	env = append(env, "FLOE_WORKSPACE_ROOTS="+filepath.Join(home, "only-here"))
	model := writeScript(t, ws, `{"requests": [{"steps": [{"tool_call": {"name": "write_file", "arguments": {"file_path": "made.txt", "content": "x"}}}]}, {"steps": [{"text": "made it"}]}]}`)
	out, errOut, code := runPiped(t, ws, env, "", "run", "--model", model, "--workspace", outside, "make a file")
	if code != 0 || !strings.Contains(out, "made it") {
		t.Fatalf("floe run --workspace %s: status %d\n%s\n%s", outside, code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(outside, "made.txt")); err != nil {
		t.Fatalf("the tool did not write into the explicit Workspace: %v", err)
	}
	out, errOut, code = runPiped(t, ws, env, "hello\n", "chat", "--model", model, "--workspace", outside)
	if code != 0 || !strings.Contains(out, "workspace "+outside) {
		t.Fatalf("floe chat --workspace %s: status %d\n%s\n%s", outside, code, out, errOut)
	}
	if _, errOut, code := runPiped(t, ws, env, "", "run", "--model", model, "--workspace", "/", "x"); code != 2 || !strings.Contains(errOut, "workspace /") {
		t.Fatalf("floe run --workspace /: status %d, want 2\n%s", code, errOut)
	}
}
