package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/cmd/floe/internal/stack"
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

// floe replay --execute that cannot replay (no Trace for the id, a Trace
// file that is missing or not a Trace) exits 2, not 1: 1 says "the engine
// behaves differently", and a gate must not read trouble as that.
func TestReplayExecuteTroubleExits2(t *testing.T) {
	home := t.TempDir()
	garbage := filepath.Join(home, "garbage.jsonl")
	if err := os.WriteFile(garbage, []byte("not a trace\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A subagent's parent without its child's Trace beside it.
	sub, err := os.ReadFile(filepath.Join("internal", "reexec", "testdata", "corpus", "subagent.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(home, "orphan.jsonl")
	if err := os.WriteFile(orphan, sub, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"replay", "--execute", "--trace", orphan},
		{"replay", "--execute", "session-2026-01-01-00-00-00-00000000"},
		{"replay", "--execute", "--trace", filepath.Join(home, "missing.jsonl")},
		{"replay", "--execute", "--trace", garbage},
	} {
		out, code := floeStdout(t, home, nil, args...)
		if code != 2 || strings.Contains(out, "equal: ") || strings.Contains(out, "different: ") {
			t.Errorf("floe %v: exit %d, want 2\n%s", args, code, out)
		}
	}
}

// floe replay --execute <id> replays a Session from the Trace files under
// $FLOE_HOME, its subagent child from its own Trace there (the corpus
// Session and its child, laid out as the tracer writes them).
func TestReplayExecuteSessionWithASubagentFromHome(t *testing.T) {
	home := t.TempDir()
	corpus := filepath.Join("internal", "reexec", "testdata", "corpus")
	dir := filepath.Join(home, "floe", "traces", "2026-12-03")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const parent, child = "session-2026-12-03-18-35-53-c0000001", "session-2026-12-03-18-35-53-30983001"
	for name, from := range map[string]string{parent: "subagent.jsonl", child: child + "_001.jsonl"} {
		b, err := os.ReadFile(filepath.Join(corpus, from))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+"_001.jsonl"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, code := floeStdout(t, home, nil, "replay", "--execute", "--diff", parent)
	if code != 0 || !strings.Contains(out, "equal: 20 records") {
		t.Fatalf("replay --execute %s: exit %d\n%s", parent, code, out)
	}
	// Without the child's Trace it cannot replay.
	if err := os.Remove(filepath.Join(dir, child+"_001.jsonl")); err != nil {
		t.Fatal(err)
	}
	if out, code := floeStdout(t, home, nil, "replay", "--execute", parent); code != 2 || !strings.Contains(out, child) {
		t.Fatalf("replay --execute without the child's Trace: exit %d, want 2 naming %s\n%s", code, child, out)
	}
}

// floe replay --execute <id> while a server holds $FLOE_HOME's store
// cannot read the Session's settings (maxTurns, compaction): it exits 2
// and says to stop the server, instead of replaying with the defaults,
// which could part from the record for that alone (exit 1, read as a
// changed engine).
func TestReplayExecuteWhileTheStoreIsHeldExits2(t *testing.T) {
	home := t.TempDir()
	floeHome := filepath.Join(home, "floe")
	dir := filepath.Join(floeHome, "traces", "2026-12-03")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("internal", "reexec", "testdata", "corpus", "max_turns.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	const sid = "session-2026-12-03-11-47-22-c0000001"
	if err := os.WriteFile(filepath.Join(dir, sid+"_001.jsonl"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := stack.Start(ctx, stack.Options{Home: floeHome, Listen: "off"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Stop()
	out, code := floeStdout(t, home, nil, "replay", "--execute", sid)
	if code != 2 || strings.Contains(out, "equal: ") || strings.Contains(out, "different: ") {
		t.Fatalf("replay --execute with the store held: exit %d, want 2\n%s", code, out)
	}
}
