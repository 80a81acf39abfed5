package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// floe runs the binary with a clean environment and returns its combined
// output and exit status.
func floeCmd(t *testing.T, home string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, buildFloe(t), args...)
	cmd.Env = cleanEnv(home)
	cmd.Dir = home
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("floe %v: %v", args, err)
	}
	return string(out), code
}

// Each command's --help lists its own flags only, exits 0, and a bad flag
// is one line pointing at --help with exit 2.
func TestPerCommandHelp(t *testing.T) {
	home := t.TempDir()
	for _, tc := range []struct {
		cmd     string
		want    []string
		notWant []string
	}{
		{"run", []string{"-approve", "-model", "-workspace"}, []string{"-http", "-replicas", "-retention", "-pool"}},
		{"setup", []string{"-replicas", "-wait", "-nats"}, []string{"-model", "-http", "-workspace", "-nats-listen"}},
		{"replay", []string{"-from-seq", "-follow"}, []string{"-model", "-http", "-replicas"}},
		{"serve", []string{"-http", "-model", "-replicas", "-sandbox", "-sandbox-network"}, []string{"-workspace", "-approve", "-pool"}},
		{"toolrunner", []string{"-pool", "-concurrency", "-sandbox", "-sandbox-network"}, []string{"-model", "-http", "-home"}},
		{"engine", []string{"-pool", "-sandbox"}, []string{"-model", "-http", "-concurrency"}},
		{"attach", []string{"-url", "-follow"}, []string{"-model", "-nats"}},
	} {
		out, code := floeCmd(t, home, tc.cmd, "--help")
		if code != 0 || !strings.HasPrefix(out, "Usage: floe "+tc.cmd) {
			t.Errorf("floe %s --help: exit %d\n%s", tc.cmd, code, out)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(out, "  "+w+" ") && !strings.Contains(out, "  "+w+"\n") {
				t.Errorf("floe %s --help lacks %s:\n%s", tc.cmd, w, out)
			}
		}
		for _, w := range tc.notWant {
			if strings.Contains(out, "  "+w+" ") {
				t.Errorf("floe %s --help lists %s, not its flag:\n%s", tc.cmd, w, out)
			}
		}
	}
	out, code := floeCmd(t, home, "run", "--bogus", "x")
	if code != 2 || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "floe run --help") {
		t.Errorf("bad flag: exit %d, want 2 and one line pointing at --help:\n%s", code, out)
	}
	out, code = floeCmd(t, home, "--version")
	if code != 0 || !strings.HasPrefix(out, "floe ") || strings.Count(out, "\n") != 1 {
		t.Errorf("floe --version: exit %d\n%s", code, out)
	}
	out, code = floeCmd(t, home, "bogus")
	if code != 2 || !strings.Contains(out, `unknown command "bogus"`) {
		t.Errorf("unknown command: exit %d\n%s", code, out)
	}
}

// The first five minutes' error paths: each is one line naming the
// problem, with the exit status a script can test.
func TestFirstFiveMinutesErrors(t *testing.T) {
	home := t.TempDir()
	env := cleanEnv(home)
	run := func(env []string, stdin string, args ...string) (string, string, int) {
		t.Helper()
		return runPiped(t, home, env, stdin, args...)
	}

	// A port already in use fails at once, naming the address.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().String()
	for _, tc := range []struct {
		env     []string
		setting string
	}{
		{append(append([]string{}, env...), "FLOE_HTTP_ADDR="+busy, "FLOE_NATS_LISTEN=off"), "FLOE_HTTP_ADDR"},
		{append(append([]string{}, env...), "FLOE_HTTP_ADDR="+freeAddr(t), "FLOE_NATS_LISTEN="+busy), "FLOE_NATS_LISTEN"},
	} {
		start := time.Now()
		_, errOut, code := run(tc.env, "", "serve")
		if code != 1 || !strings.Contains(errOut, busy+" is already in use") || !strings.Contains(errOut, tc.setting) {
			t.Errorf("serve on a busy %s: status %d\n%s", tc.setting, code, errOut)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("serve on a busy %s took %v to fail", tc.setting, d)
		}
	}

	// Replaying a Session that does not exist is an error.
	_, errOut, code := run(append(append([]string{}, env...), "FLOE_NATS_LISTEN=off"), "", "replay", "session-2026-01-01-00-00-00-deadbeef")
	if code != 1 || !strings.Contains(errOut, "session session-2026-01-01-00-00-00-deadbeef not found") {
		t.Errorf("replay of an unknown session: status %d\n%s", code, errOut)
	}

	// Approvals with no terminal on stdin say so and deny.
	ws := filepath.Join(home, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	model := writeScript(t, home, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "arguments": {"description": "x", "cmd": "echo ran-it"}}}]},
	  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "understood"}]}
	]}`)
	out, errOut, code := runPiped(t, ws, env, "y\n", "run", "--model", model, "--approve", "always-ask", "run it")
	if code != 0 || !strings.Contains(errOut, "allow exec_command? [Y/n/a] no terminal to ask: denied") || strings.Contains(out, "ran-it\n") {
		t.Errorf("run --approve always-ask without a terminal: status %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "✗ deny") {
		t.Errorf("the denial is not shown:\n%s", out)
	}

	// A model server on this machine that refuses the connection: one
	// retry (it is not starting in the next minute, however long the
	// ladder), one readable line per failed attempt naming its URL, and
	// the final error repeats the cause.
	dead := freeAddr(t)
	renv := append(append([]string{}, env...), "OPENAI_BASE_URL=http://"+dead+"/v1", "OPENAI_API_KEY=sk-x",
		"FLOE_RETRY_BASE_MS=50", "FLOE_RETRY_CAP_MS=100", "FLOE_RETRY_MAX=2")
	out, errOut, code = runPiped(t, ws, renv, "", "run", "--model", "openai:gpt-4o-mini", "hello")
	if code != 1 {
		t.Errorf("unreachable model: status %d, want 1", code)
	}
	refused := "connection refused by the model server at http://" + dead + "/v1/chat/completions (is it running?)"
	for _, want := range []string{
		"model request failed: " + refused + "; retrying in 0.1 s (attempt 2 of 3)",
		"model request failed: " + refused + "; giving up after 2 attempts",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "attempt 3 of 3") {
		t.Errorf("a refused local model server was retried more than once:\n%s", out)
	}
	if !strings.Contains(errOut, "model request failed: "+refused) {
		t.Errorf("the final error does not repeat the cause:\n%s", errOut)
	}
	// The services' JSON logs stay off the terminal, in a file.
	if strings.Contains(errOut, `{"level"`) || strings.Contains(out, `{"level"`) {
		t.Errorf("JSON log lines on the terminal:\n%s\n%s", out, errOut)
	}
	logs, _ := os.ReadFile(filepath.Join(home, "floe", "logs", "floe-run.log"))
	if !strings.Contains(string(logs), `"level"`) {
		t.Errorf("no log lines in $FLOE_HOME/logs/floe-run.log")
	}
	_, errOut, _ = runPiped(t, ws, renv, "", "run", "-v", "--model", "openai:gpt-4o-mini", "hello")
	if !strings.Contains(errOut, `"level":"warn"`) {
		t.Errorf("-v does not show the logs on stderr:\n%s", errOut)
	}
}

// --sandbox and --sandbox-network override FLOE_SANDBOX and
// FLOE_SANDBOX_NETWORK; a bad value, or a backend the host lacks named by
// either, stops serve at start with one line (fail-closed, protocol.md §7).
func TestSandboxFlagsOverrideTheEnvironment(t *testing.T) {
	home := t.TempDir()
	env := append(cleanEnv(home), "FLOE_NATS_LISTEN=off", "FLOE_HTTP_ADDR="+freeAddr(t))
	noBwrap := t.TempDir() // a PATH without bwrap
	for _, tc := range []struct {
		env  []string
		args []string
		want []string
	}{
		{nil, []string{"--sandbox", "docker"}, []string{"FLOE_SANDBOX", `"docker"`}},
		{nil, []string{"--sandbox-network=maybe"}, []string{"FLOE_SANDBOX_NETWORK", `"maybe"`}},
		{[]string{"FLOE_SANDBOX=bogus", "PATH=" + noBwrap}, []string{"--sandbox", "bwrap"}, []string{"FLOE_SANDBOX=bwrap", "bwrap not found"}},
		{[]string{"FLOE_SANDBOX=off", "PATH=" + noBwrap}, []string{"--sandbox", "bwrap"}, []string{"FLOE_SANDBOX=bwrap", "bwrap not found"}},
	} {
		e := append(append([]string{}, env...), tc.env...)
		_, errOut, code := runPiped(t, home, e, "", append([]string{"serve"}, tc.args...)...)
		line := strings.TrimSpace(errOut)
		if code != 1 || strings.Count(line, "\n") != 0 {
			t.Errorf("serve %v with %v: status %d, want 1 and one line:\n%s", tc.args, tc.env, code, errOut)
		}
		for _, w := range tc.want {
			if !strings.Contains(line, w) {
				t.Errorf("serve %v with %v: %q lacks %q", tc.args, tc.env, line, w)
			}
		}
	}
}

// The guide's floe serve example (docs/guide.md, where the README's quick
// start points) works as written: run as a script (the binary for `go run
// ./cmd/floe`, a free port for 7364), the stream opened first sees the
// Task, attach renders it, and chat resumes it.
func TestGuideServeExample(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "From a project directory under your home directory")
	if !ok {
		t.Fatal("docs/guide.md: the floe serve example is gone")
	}
	_, rest, _ = strings.Cut(rest, "```sh\n")
	script, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/guide.md: the example's code block does not end")
	}
	home := t.TempDir()
	proj := filepath.Join(home, "project")
	if err := os.MkdirAll(proj, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proj, "README.md"), []byte("# The example project\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := strings.TrimPrefix(freeAddr(t), "127.0.0.1:")
	script = strings.ReplaceAll(script, "go run ./cmd/floe", buildFloe(t))
	script = strings.ReplaceAll(script, "7364", port)
	script = "set -e\n" + script + "\nkill $(jobs -p) 2>/dev/null; wait\n"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = proj
	cmd.Env = append(cleanEnv(home), "FLOE_HTTP_ADDR=127.0.0.1:"+port, "FLOE_NATS_LISTEN=off")
	cmd.Stdin = strings.NewReader("/exit\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the example failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		`"taskId":"task-`, // the Task was accepted
		`README.md starts with: "# The example project"`, // attach rendered the answer
		"resumed session session-",                       // chat --resume found it
		"resume with: floe chat --resume session-",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the example's output lacks %q:\n%s", want, out)
		}
	}
	sse := false // the stream, opened before the Task, saw read_file's output
	for _, l := range strings.Split(string(out), "\n") {
		sse = sse || strings.HasPrefix(l, "data: ") && strings.Contains(l, "The example project")
	}
	if !sse {
		t.Errorf("the SSE stream did not carry the Task:\n%s", out)
	}
}
