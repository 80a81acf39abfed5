//go:build linux

package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"floe.dev/pkg/procfs"
)

// `go run ./cmd/floe serve &` then `kill $!`: killing the go tool ends
// floe serve too (go run passes no signal on); a parent by another name
// (a shell, nohup) may die without taking the server along.
func TestServeEndsWithItsGoRunParent(t *testing.T) {
	for _, tc := range []struct {
		parent   string
		followed bool
	}{{"go", true}, {"sh-like", false}} {
		t.Run(tc.parent, func(t *testing.T) {
			home, ws, env := chatEnv(t)
			// A parent named like the go tool: it starts floe serve, writes
			// floe's pid, and waits.
			dir := t.TempDir()
			parent := filepath.Join(dir, tc.parent)
			script := "#!/bin/sh\n\"$@\" &\necho $! > " + filepath.Join(dir, "pid") + "\nwait\n"
			if err := os.WriteFile(parent, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			addr := freeAddr(t)
			cmd := exec.Command(parent, buildFloe(t), "serve")
			cmd.Dir = ws
			cmd.Env = append(append([]string{}, env...), "FLOE_HTTP_ADDR="+addr, "FLOE_NATS_LISTEN=off", "FLOE_HOME="+filepath.Join(home, "server"))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := 0
			deadline := time.Now().Add(bound)
			for pid == 0 && time.Now().Before(deadline) {
				b, _ := os.ReadFile(filepath.Join(dir, "pid"))
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				time.Sleep(20 * time.Millisecond)
			}
			if pid == 0 {
				t.Fatal("the parent did not start floe serve")
			}
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			waitHealthy(t, addr)
			cmd.Process.Kill() // kill $! of the go tool
			cmd.Wait()
			// Gone: no such process, or a zombie nobody reaped yet (it is
			// reparented to PID 1, which may reap late).
			gone := func() bool { return !procfs.Alive(pid) }
			stay := time.Now().Add(3 * time.Second) // a server left alone is still up then
			for !gone() && time.Now().Before(deadline) && (tc.followed || time.Now().Before(stay)) {
				time.Sleep(50 * time.Millisecond)
			}
			if gone() != tc.followed {
				stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
				t.Fatalf("parent %q killed: floe serve gone = %v, want %v\n%s", tc.parent, gone(), tc.followed, stat)
			}
		})
	}
}

// waitHealthy polls /healthz on addr.
func waitHealthy(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("floe serve not healthy on %s", addr)
}
