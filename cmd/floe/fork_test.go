package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
)

// floe fork straight into $FLOE_HOME: an imported Session forks into a new
// one whose Trace starts with forked_from; a bad --at is refused.
func TestForkWithoutServer(t *testing.T) {
	home := t.TempDir()
	ws := filepath.Join(home, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	fixture, _ := filepath.Abs(filepath.Join("internal", "e2e", "testdata", "interop", "original_tools.jsonl"))
	if out, code := floeCmd(t, home, "import", fixture, "--workspace", ws); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	out, code := floeStdout(t, home, nil, "fork", fixtureSID)
	id := strings.TrimSpace(out)
	if code != 0 || !omni.ValidSessionID(id) || !strings.HasPrefix(id, "session-") {
		t.Fatalf("fork: exit %d\n%s", code, out)
	}
	got, code := floeStdout(t, home, nil, "export", id)
	head, _, _ := strings.Cut(got, "\n")
	if code != 0 || !strings.Contains(head, `"forked_from":{"session_id":"`+fixtureSID+`","seq":0}`) || !strings.Contains(head, `"session_id":"`+id+`"`) {
		t.Fatalf("export of the fork: exit %d, head %s", code, head)
	}
	if out, code := floeCmd(t, home, "fork", fixtureSID, "--at", "999999"); code != 1 || !strings.Contains(out, "not a stream position") {
		t.Fatalf("fork --at 999999: exit %d\n%s", code, out)
	}
	if out, code := floeCmd(t, home, "fork"); code != 2 {
		t.Fatalf("fork without an id: exit %d\n%s", code, out)
	}
}
