package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// floe replay --execute --trace reproduces a corpus Session (exit 0); a
// changed record parts at the changed record (exit 1, --diff shows it).
func TestReplayExecuteTraceFile(t *testing.T) {
	home := t.TempDir()
	corpus, _ := filepath.Abs(filepath.Join("internal", "reexec", "testdata", "corpus", "tools_retry.jsonl"))
	out, code := floeStdout(t, home, nil, "replay", "--execute", "--trace", corpus)
	if code != 0 || !strings.Contains(out, "equal: ") {
		t.Fatalf("replay --execute of the corpus: exit %d\n%s", code, out)
	}
	b, err := os.ReadFile(corpus)
	if err != nil {
		t.Fatal(err)
	}
	// A record without the last request_end: the engine writes one, so
	// the replay parts from the record there.
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if !strings.Contains(lines[len(lines)-1], `"request_end"`) {
		t.Fatalf("the corpus does not end with request_end: %s", lines[len(lines)-1])
	}
	changed := filepath.Join(home, "changed.jsonl")
	os.WriteFile(changed, []byte(strings.Join(lines[:len(lines)-1], "\n")+"\n"), 0o644)
	out, code = floeStdout(t, home, nil, "replay", "--execute", "--diff", "--trace", changed)
	if code != 1 || !strings.Contains(out, "first difference at record "+strconv.Itoa(len(lines))) {
		t.Fatalf("replay --execute of a changed record: exit %d\n%s", code, out)
	}
}
