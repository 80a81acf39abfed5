package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"floe.dev/pkg/omni"
)

// A Task whose scripted model names a device, a FIFO or a huge file (what a
// client could have asked for before the gateway refused such models, or an
// operator's typo) fails once, in bounded time, without reading the file;
// it is not redelivered, and the engine goes on serving other Sessions.
func TestTaskWithAnUnbuildableModelFailsOnceAndTheEngineServesOn(t *testing.T) {
	e := start(t, envOpts{})
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.json")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root:SECRETHASH:19000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"scripted:/dev/zero", "scripted:" + fifo, "scripted:" + big, "scripted:" + secret} {
		sid := e.session(ref, omni.ApproveAllowAll, nil)
		task := e.submit(sid, "hi")
		rs, status := e.wait(sid, task)
		if status != omni.StatusFailed {
			t.Errorf("%s: status %q, want failed; stream %v", ref, status, labels(rs, noPartials))
		}
		for _, r := range rs {
			if strings.Contains(string(r.raw), "SECRET") || strings.Contains(string(r.raw), "root:") {
				t.Errorf("%s: the stream echoes the file: %s", ref, r.raw)
			}
		}
	}
	// The failed Tasks were acknowledged: nothing is left to redeliver.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eventually(t, 20*time.Second, "the task queue to drain", func() bool {
		s, err := e.st.JS.Stream(ctx, omni.TasksStream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	sid := e.session(e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"text": "still here"}}},
	}}), omni.ApproveAllowAll, nil)
	task := e.submit(sid, "hi")
	if _, status := e.wait(sid, task); status != omni.StatusCompleted {
		t.Fatalf("a good Session after the bad ones: status %q, want completed", status)
	}
}
