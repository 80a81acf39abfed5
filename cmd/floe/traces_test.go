package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const fixtureSID = "session-2026-07-19-01-10-22-3f8a1c2d"

// floe import straight into $FLOE_HOME, then floe export gives the file
// back byte for byte; a second import is refused, as is bad input.
func TestImportExportWithoutServer(t *testing.T) {
	home := t.TempDir()
	ws := filepath.Join(home, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	fixture, _ := filepath.Abs(filepath.Join("internal", "e2e", "testdata", "interop", "original_tools.jsonl"))
	want, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	out, code := floeCmd(t, home, "import", fixture)
	if code != 1 || !strings.Contains(out, "pass workspace") {
		t.Fatalf("import without a usable workspace: exit %d\n%s", code, out)
	}
	out, code = floeCmd(t, home, "import", fixture, "--workspace", ws)
	if code != 0 || !strings.Contains(out, "imported "+fixtureSID) {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(home, "floe", "traces", "2026-07-18", fixtureSID+"_001.jsonl")); err != nil {
		t.Fatalf("imported file: %v", err)
	}
	out, code = floeCmd(t, home, "import", fixture, "--workspace", ws)
	if code != 1 || !strings.Contains(out, "already exists") {
		t.Fatalf("second import: exit %d\n%s", code, out)
	}
	bad := filepath.Join(home, "bad.jsonl")
	os.WriteFile(bad, []byte("not a trace\nat all\n"), 0o644)
	out, code = floeCmd(t, home, "import", bad, "--workspace", ws)
	if code != 1 || !strings.Contains(out, "line 1") {
		t.Fatalf("bad import: exit %d\n%s", code, out)
	}
	got, code := floeStdout(t, home, nil, "export", fixtureSID)
	if code != 0 || got != string(want) {
		t.Fatalf("export: exit %d, equal %v\n%.300s", code, got == string(want), got)
	}
	if _, code := floeStdout(t, home, nil, "export", fixtureSID, "--index", "2"); code != 1 {
		t.Fatalf("export of a missing index: exit %d", code)
	}
}

// With --server, import and export go through a running `floe serve`.
func TestImportExportThroughServer(t *testing.T) {
	home := t.TempDir()
	ws := filepath.Join(home, "ws")
	os.MkdirAll(ws, 0o755)
	fixture, _ := filepath.Abs(filepath.Join("internal", "e2e", "testdata", "interop", "original_compacted_002.jsonl"))
	want, _ := os.ReadFile(fixture)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	env := append(cleanEnv(home), "FLOE_HTTP_ADDR="+addr, "FLOE_NATS_LISTEN=off", "FLOE_API_TOKEN=me:secret-token")
	srv := exec.Command(buildFloe(t), "serve")
	srv.Env, srv.Dir = env, home
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	t.Cleanup(func() {
		srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			srv.Process.Kill()
			<-done
		}
	})
	url := "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("floe serve did not listen on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cli := []string{"FLOE_API_TOKEN=me:secret-token"}
	out, code := floeStdout(t, home, cli, "import", fixture, "--workspace", ws, "--server", url)
	if code != 0 || !strings.Contains(out, "imported session-2026-07-20-16-00-00-0a1b2c3d") {
		t.Fatalf("import --server: exit %d\n%s", code, out)
	}
	got, code := floeStdout(t, home, cli, "export", "session-2026-07-20-16-00-00-0a1b2c3d", "--server", url)
	if code != 0 || got != string(want) {
		t.Fatalf("export --server: exit %d, equal %v\n%.300s", code, got == string(want), got)
	}
	if out, code := floeStdout(t, home, nil, "import", fixture, "--workspace", ws, "--server", url); code != 1 || !strings.Contains(out, "401") {
		t.Fatalf("import --server without the token: exit %d\n%s", code, out)
	}
}

// floeStdout runs the binary with a clean environment plus extra and
// returns its stdout (stderr appended when it fails) and exit status.
func floeStdout(t *testing.T, home string, extra []string, args ...string) (string, int) {
	t.Helper()
	bin := buildFloe(t) // before the deadline: a busy machine builds slowly
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(cleanEnv(home), extra...)
	cmd.Dir = home
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("floe %v: %v", args, err)
	}
	if code != 0 {
		return string(out) + stderr.String(), code
	}
	return string(out), code
}
