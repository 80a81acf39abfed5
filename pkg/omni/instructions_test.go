package omni

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadInstructions(t *testing.T) {
	dir := t.TempDir()
	if got, err := ReadInstructions(dir); got != "" || err != nil {
		t.Fatalf("no AGENTS.md: %q, %v", got, err)
	}
	path := filepath.Join(dir, InstructionsFile)
	if err := os.WriteFile(path, []byte("\n  Use tabs.\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadInstructions(dir); got != "Use tabs." || err != nil {
		t.Fatalf("got %q, %v", got, err)
	}
	// Longer than the cap: its head, whole characters only, and a note.
	long := "x" + strings.Repeat("é", MaxInstructions) // 2 bytes each: the cap cuts one in half
	if err := os.WriteFile(path, []byte(long), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadInstructions(dir)
	if err != nil || !strings.HasPrefix(got, "x"+strings.Repeat("é", MaxInstructions/2-1)+"\n\n[") || !strings.HasSuffix(got, "[AGENTS.md truncated: only its first 64 KiB are included]") || strings.Contains(got, "\uFFFD") {
		t.Fatalf("truncated: %d bytes, %v, tail %q", len(got), err, got[len(got)-80:])
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadInstructions(dir); err == nil {
		t.Fatal("a directory named AGENTS.md read as instructions")
	}
	if got := WithInstructions("base", "do x"); got != "base\n\n# Project instructions (AGENTS.md)\n\ndo x" {
		t.Errorf("WithInstructions = %q", got)
	}
	if got := WithInstructions("base", ""); got != "base" {
		t.Errorf("WithInstructions without any = %q", got)
	}
}
