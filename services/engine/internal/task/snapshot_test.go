package task

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/snapshot"
)

// snapshotScript is a recorded Session of six Tasks: parallel tool calls,
// a failed attempt and its retry, compactions before and after a Task, an
// abort with a running tool, and Tasks after each.
const snapshotScript = `{"requests": [
  {"expect_last_user": "run two", "steps": [{"text": "I will run two."}, {"parallel_tool_calls": [
    {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "echo one"}},
    {"name": "exec_command", "id": "call_2", "arguments": {"cmd": "echo two"}}]}]},
  {"expect_tool_outputs": ["call_1", "call_2"], "steps": [{"text": "Both ran."}]},
  {"expect_last_user": "again", "steps": [{"text": "Half", "end": false}, {"error": {"status": "timeout", "message": "reset"}}]},
  {"steps": [{"text": "Again."}]},
  {"steps": [{"text": "[summary]we ran two commands[/summary]"}]},
  {"expect_last_user": "compact me", "steps": [{"text": "Sure."}]},
  {"steps": [{"text": "[summary]and compacted once[/summary]"}]},
  {"expect_last_user": "after", "steps": [{"text": "After."}]},
  {"expect_last_user": "hang", "steps": [{"tool_call": {"name": "exec_command", "id": "call_5", "arguments": {"cmd": "sleep 100"}}}]},
  {"expect_last_user": "last", "steps": [{"text": "Last."}]}
]}`

// playSnapshotSession runs the recorded Session with how loading the
// history at each Task's start: nil folds it all (trace.Replay), or a
// function giving the Store to use for that Task. It returns every model
// request as JSON lines (timestamps blanked: they are the clock's) and
// the log.
func playSnapshotSession(t *testing.T, store func(h *harness, log zerolog.Logger) *snapshot.Store) ([]string, string) {
	h := newHarness(t, snapshotScript, nil)
	h.deps.Snapshots = nil
	rec := h.recorded()
	logs := &bustest.Buffer{}
	sid := "snap1"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, func(job omni.ToolJob) *omni.Message {
		if job.ToolCallID == "call_5" {
			return nil // runs until cancelled
		}
		return echo(job)
	})
	task := func(id, text string) {
		t.Helper()
		if store != nil {
			h.deps.Snapshots = store(h, zerolog.New(logs))
		}
		h.complete(sid, id, text)
	}
	task("t1", "run two")
	task("t2", "again")
	h.update(sid, func(r *omni.SessionRecord) {
		r.Compaction = omni.CompactionConfig{MaxSessionTurns: 1, Mode: omni.ModeSummarize}
	})
	task("t3", "compact me")
	h.update(sid, func(r *omni.SessionRecord) { r.Compaction = omni.CompactionConfig{} })
	task("t4", "after")
	if store != nil {
		h.deps.Snapshots = store(h, zerolog.New(logs))
	}
	done := h.run(sid, "t5", "hang")
	bustest.Eventually(t, 10*time.Second, "call_5 taken", func() bool {
		return strings.Contains(strings.Join(fr.ran(), ","), "call_5")
	})
	h.abort(sid, done)
	task("t6", "last")

	var out []string
	for _, req := range rec.requests() {
		var b strings.Builder
		for _, m := range req {
			mm := *m
			mm.Timestamp = ""
			b.Write(omni.MustMarshal(&mm))
			b.WriteByte('\n')
		}
		out = append(out, b.String())
	}
	return out, logs.String()
}

// A Session's Tasks send the model exactly the same requests whether each
// Task folds the whole history or starts from a context snapshot, kept in
// this engine's memory or read from the bucket by another engine.
func TestSnapshotsNeverChangeTheModelRequests(t *testing.T) {
	want, _ := playSnapshotSession(t, nil)
	if len(want) != 10 {
		t.Fatalf("%d model requests, want the script's 10", len(want))
	}
	var one *snapshot.Store
	memory := func(h *harness, log zerolog.Logger) *snapshot.Store {
		if one == nil {
			one = snapshot.Open(context.Background(), h.env.JS, "", log)
		}
		return one
	}
	bucket := func(h *harness, log zerolog.Logger) *snapshot.Store { // a new engine each Task
		s := snapshot.Open(context.Background(), h.env.JS, "", log)
		s.Every, s.Grow = 1, 0
		return s
	}
	for name, store := range map[string]func(*harness, zerolog.Logger) *snapshot.Store{"memory": memory, "bucket": bucket} {
		got, log := playSnapshotSession(t, store)
		if len(got) != len(want) {
			t.Fatalf("%s: %d model requests, want %d", name, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: model request %d =\n%s\nwant\n%s", name, i, got[i], want[i])
			}
		}
		if n := strings.Count(log, "folding the whole history"); n != 1 {
			t.Errorf("%s: %d full folds, want 1 (the first Task's):\n%s", name, n, log)
		}
	}
}
