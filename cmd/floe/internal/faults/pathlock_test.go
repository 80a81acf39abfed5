package faults

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/omni"
)

// Eight parallel edit_file calls on one file, run by two toolrunner
// processes (four at once each), keep all eight changes: the per-path lock
// is a key of the floe_locks bucket, so it holds across processes, not
// only within one (protocol.md §7; issue 20's acceptance).
func TestParallelEditsOnTwoRunnerProcessesKeepEveryChange(t *testing.T) {
	const edits = 8
	c := newCluster(t, 1, 1)
	// Who took each lock: the value of a floe_locks key is its runner.
	var mu sync.Mutex
	owners := map[string]int{}
	sub, err := c.nc.Subscribe("$KV."+omni.LocksBucket+".>", func(m *nats.Msg) {
		if len(m.Data) > 0 {
			mu.Lock()
			owners[string(m.Data)]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c.service("toolrunner", fmt.Sprintf("toolrunner-%d", i+1), fmt.Sprintf("FLOE_TOOL_CONCURRENCY=%d", edits/2))
	}
	c.service("engine", "engine")

	path := filepath.Join(c.ws, "shared.txt")
	var body strings.Builder
	for i := range edits {
		fmt.Fprintf(&body, "slot %d: todo\n", i)
	}
	// Big enough that a read-modify-write takes a while.
	body.WriteString(strings.Repeat("padding line\n", 200000))
	if err := os.WriteFile(path, []byte(body.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var parallel []any
	for i := range edits {
		parallel = append(parallel, map[string]any{"name": "edit_file", "id": fmt.Sprintf("edit_%d", i),
			"arguments": map[string]any{"file_path": "shared.txt",
				"old_string": fmt.Sprintf("slot %d: todo", i), "new_string": fmt.Sprintf("slot %d: done", i)}})
	}
	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"parallel_tool_calls": parallel}}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}})
	sid := c.session(ref)
	rs, status := c.wait(sid, c.submit(sid, "edit in parallel"), 2*time.Minute, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q; last: %v", status, lastLabels(rs, 10))
	}
	o := checkSession(t, rs, "edit in parallel")
	for i := range edits {
		if p := o.outputs[fmt.Sprintf("edit_%d", i)].msg.Payload; p.StopReason == omni.StatusFailed {
			t.Errorf("edit %d failed: %s", i, p.Output)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range edits {
		if want := fmt.Sprintf("slot %d: done\n", i); !strings.Contains(string(got), want) {
			t.Errorf("the file lacks edit %d (%q): an edit was lost", i, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("locks taken per runner: %v", owners)
	if len(owners) < 2 {
		t.Errorf("the edits' locks were taken by %d runner(s) (%v), want both processes", len(owners), owners)
	}
	c.noViolations()
}
