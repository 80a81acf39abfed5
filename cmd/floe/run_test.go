package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
)

// buildFloe builds this binary once per test run (TestMain removes it).
func buildFloe(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		bin := filepath.Join(binDir, "floe")
		out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		builtBin = bin
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

var (
	binDir    string
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	var err error
	if binDir, err = os.MkdirTemp("", "floe-bin-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(binDir)
	os.Exit(code)
}

// cleanEnv is the environment of a fresh machine: no provider configured,
// FLOE_HOME and HOME in temp dirs.
func cleanEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FLOE_") || strings.HasPrefix(k, "OPENAI_") || strings.HasPrefix(k, "ANTHROPIC_") || k == "HOME" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "FLOE_HOME="+filepath.Join(home, "floe"), "HOME="+home)
}

// The README's quick start: with no provider configured, `floe run` uses
// the demo model, says so, completes and prints the Trace path.
func TestRunWithDemoModel(t *testing.T) {
	bin := buildFloe(t)
	home := t.TempDir()
	ws := filepath.Join(home, "project")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "README.md"), []byte("# Hello project\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run", "what is in this folder?")
	cmd.Dir = ws
	cmd.Env = cleanEnv(home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("floe run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), "demo model") {
		t.Errorf("stderr does not say it uses the demo model:\n%s", stderr.String())
	}
	for _, want := range []string{"exec_command", "README.md", "Hello project"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	m := regexp.MustCompile(`trace (\S+\.jsonl)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no trace path printed:\n%s", stderr.String())
	}
	f, err := os.Open(m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	msgs, skipped, err := trace.Read(f)
	if err != nil || len(skipped) > 0 || len(msgs) < 10 {
		t.Fatalf("trace %s: %d records, skipped %v, err %v", m[1], len(msgs), skipped, err)
	}
	if msgs[0].Type != omni.KindSessionMeta || msgs[1].Payload.Type != omni.TypeToolListReady {
		t.Errorf("trace head = %s, %s; want session_meta, tool_list_ready", msgs[0].Type, msgs[1].Payload.Type)
	}
	// The Session is titled by its prompt, as a first Task through the
	// gateway is (or, once the demo model has answered the title request
	// after the Task, by the model's title of it: "What is in this
	// folder"); and a one-shot command prints no service log line.
	list := exec.CommandContext(ctx, bin, "sessions")
	list.Env = cleanEnv(home)
	out, err := list.CombinedOutput()
	if err != nil || !strings.Contains(strings.ToLower(string(out)), "what is in this folder") {
		t.Errorf("floe sessions: %v; the run's Session is not titled by its prompt:\n%s", err, out)
	}
	if strings.Contains(string(out), `"level"`) {
		t.Errorf("floe sessions printed service log lines:\n%s", out)
	}
}

// A malformed script file is a clear error at start, and the run fails.
func TestRunWithMalformedScriptFails(t *testing.T) {
	bin := buildFloe(t)
	home := t.TempDir()
	script := filepath.Join(home, "bad.json")
	if err := os.WriteFile(script, []byte(`{"requests": [{"steps": [{"txt": "x"}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run", "--model", "scripted:"+script, "--workspace", home, "hi")
	cmd.Env = cleanEnv(home)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("floe run succeeded with a malformed script:\n%s", out)
	}
	if !strings.Contains(string(out), "unknown step kind") {
		t.Fatalf("error does not explain the script problem:\n%s", out)
	}
}
