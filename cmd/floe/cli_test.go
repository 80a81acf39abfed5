package main

import (
	"context"
	"os/exec"
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
		{"serve", []string{"-http", "-model", "-replicas"}, []string{"-workspace", "-approve", "-pool"}},
		{"toolrunner", []string{"-pool", "-concurrency"}, []string{"-model", "-http", "-home"}},
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
