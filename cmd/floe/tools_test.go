package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/cmd/floe/internal/mcptest"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// `floe tools` against a running `floe serve` lists the built-in and MCP
// tools with their source and permission, and the MCP servers' state; a
// config file that does not parse stops `floe run` at start naming the
// file and position.
func TestToolsListsAPoolsToolsWithTheirSource(t *testing.T) {
	bin := buildFloe(t)
	url := mcptest.Server(t)

	home := t.TempDir()
	cfg := filepath.Join(home, "mcp.json")
	body := fmt.Sprintf(`{"servers": {"go": {"url": %q}, "gone": {"command": "/nonexistent/floe-mcp"}}}`, url)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	natsAddr := freeAddr(t)
	env := append(cleanEnv(home), "FLOE_MCP_CONFIG="+cfg, "FLOE_NATS_LISTEN="+natsAddr, "FLOE_HTTP_ADDR="+freeAddr(t))
	serve := exec.Command(bin, "serve")
	serve.Env = env
	var serveLog bytes.Buffer
	serve.Stdout, serve.Stderr = &serveLog, &serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- serve.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = serve.Process.Kill()
			<-done
		}
	}()

	var out []byte
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		cmd := exec.CommandContext(ctx, bin, "tools")
		cmd.Env = env
		var err error
		out, err = cmd.CombinedOutput()
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("floe tools: %v\n%s\nserve log:\n%s", err, out, serveLog.String())
		}
		time.Sleep(300 * time.Millisecond)
	}
	for _, re := range []string{
		`pool default \(answered by \S+\): 6 tools`,
		`exec_command\s+builtin\s+rw`,
		`read_file\s+builtin\s+r\n`,
		`mcp__go__echo\s+mcp:go\s+r\n`,
		`go\s+http\s+completed\s+2`,
		`gone\s+stdio\s+failed\s+0\s+.*/nonexistent/floe-mcp`,
	} {
		if !regexp.MustCompile(re).Match(out) {
			t.Errorf("floe tools output lacks %s:\n%s", re, out)
		}
	}

	// floe run says which server did not connect.
	home2 := t.TempDir()
	ws := filepath.Join(home2, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	runOK := exec.Command(bin, "run", "hello")
	runOK.Dir = ws
	runOK.Env = append(cleanEnv(home2), "FLOE_MCP_CONFIG="+cfg)
	if msg, err := runOK.CombinedOutput(); err != nil || !strings.Contains(string(msg), "MCP server gone not connected (its tools are unavailable): connect:") {
		t.Errorf("floe run with an unreachable MCP server: %v\n%s", err, msg)
	}

	bad := filepath.Join(home, "bad.json")
	if err := os.WriteFile(bad, []byte("{\n  \"servers\": {\"a\": {\"command\": \"x\"},}\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := exec.Command(bin, "run", "hello")
	run.Env = append(cleanEnv(t.TempDir()), "FLOE_MCP_CONFIG="+bad)
	msg, err := run.CombinedOutput()
	if err == nil || !strings.Contains(string(msg), "FLOE_MCP_CONFIG "+bad) || !strings.Contains(string(msg), "line 2, column") {
		t.Errorf("floe run with a bad MCP config: %v\n%s", err, msg)
	}
}

// `floe tools` waits up to --timeout for a pool whose runner has not
// subscribed yet (NATS answers "no responders" at once), and exits non-zero
// naming the pool when none answers in time.
func TestToolsWaitsForARunnerThatIsStillStarting(t *testing.T) {
	bin := buildFloe(t)
	env := bustest.Start(t, bus.Config{})
	url := env.Server.ClientURL()

	tools := func(timeout string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "tools", "--nats", url, "--pool", "late", "--timeout", timeout)
		cmd.Env = cleanEnv(t.TempDir())
		return cmd.CombinedOutput()
	}

	out, err := tools("300ms")
	if err == nil || !strings.Contains(string(out), "pool late: no runner answered") || !strings.Contains(string(out), "no tool list from pool late") {
		t.Fatalf("floe tools with no runner: %v\n%s", err, out)
	}

	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := tools("40s")
		done <- result{out, err}
	}()
	// The runner subscribes later (if the command is slower to start than
	// this pause, the test passes without exercising the wait: it never
	// fails for load).
	time.Sleep(1500 * time.Millisecond)
	reply, err := omni.Pack(omni.ToolList{Runner: "late-runner", Tools: []omni.ToolSpec{{Name: "read_file", Permission: "r"}}})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := env.Conn.Subscribe(omni.ToolListSubject("late"), func(m *nats.Msg) { _ = m.Respond(reply) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	r := <-done
	if r.err != nil || !regexp.MustCompile(`pool late \(answered by late-runner\): 1 tools`).Match(r.out) {
		t.Fatalf("floe tools with a late runner: %v\n%s", r.err, r.out)
	}
}
