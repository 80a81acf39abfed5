package toolrunner_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/toolrunner"
)

// Parallel edit_file calls on one file, spread over two runners (each
// with room to run them all at once), keep every change: the per-path
// lock in the floe_locks bucket holds across runners (protocol.md §7).
func TestParallelEditsOfOneFileOnTwoRunnersKeepEveryChange(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const edits = 8
	path := filepath.Join(h.ws, "shared.txt")
	var body strings.Builder
	for i := range edits {
		fmt.Fprintf(&body, "slot %d: todo\n", i)
	}
	// Big enough that a read-modify-write takes a while.
	body.WriteString(strings.Repeat("padding line\n", 200000))
	if err := os.WriteFile(path, []byte(body.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range edits {
		args, _ := json.Marshal(map[string]any{"file_path": "shared.txt",
			"old_string": fmt.Sprintf("slot %d: todo", i), "new_string": fmt.Sprintf("slot %d: done", i)})
		h.enqueue(omni.ToolJob{SessionID: "s-lock", ToolCallID: fmt.Sprintf("e%d", i), Name: "edit_file",
			Arguments: string(args), Workspace: h.ws, EnqueuedUnixMs: time.Now().UnixMilli()})
	}
	h.start(toolrunner.Config{RunnerID: "lock-r1", Concurrency: edits})
	h.start(toolrunner.Config{RunnerID: "lock-r2", Concurrency: edits})
	for i := range edits {
		p := h.checkSegment("s-lock", h.waitOutput("s-lock", fmt.Sprintf("e%d", i)))
		if p.StopReason == omni.StatusFailed {
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
}
