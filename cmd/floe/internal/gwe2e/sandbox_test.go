package gwe2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// `floe serve` logs its tool sandbox once at start (issue 20 point 6):
// one info line "tool sandbox" naming the backend `auto` takes on this
// host (never off: CI runs the confined path) and the network setting,
// and no "NONE AVAILABLE" warning.
func TestServeLogsTheSandboxOnceAtStart(t *testing.T) {
	h := newServeHome(t, "scripted:demo")
	p := h.serve()
	runnerStarted(t, p)
	p.stop()
	var lines []map[string]any
	for _, l := range strings.Split(p.errs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			continue
		}
		msg, _ := m["message"].(string)
		if strings.Contains(msg, "NONE AVAILABLE") {
			t.Errorf("serve warns the sandbox is missing: %s", l)
		}
		if msg == "tool sandbox" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d tool sandbox lines, want 1\nstderr:\n%s", len(lines), p.errs.String())
	}
	l := lines[0]
	if b, _ := l["sandbox"].(string); l["level"] != "info" || b == "" || b == "off" || l["network"] != "on" {
		t.Fatalf("tool sandbox line %v, want level info, a confining backend, network on", l)
	}
}

// With `auto` on a host that has no backend (no Landlock: a seccomp
// filter makes landlock_create_ruleset fail with ENOSYS; no bwrap: a PATH
// without it) `floe serve` still starts, its tools unconfined, and says
// so loudly: one warn line "tool sandbox: NONE AVAILABLE, tools run
// unconfined" naming why each backend failed, and no info line claiming
// a sandbox. Hook commands run confined like tools (SPEC §7 Hooks,
// hooks.md): with a hooks file that names a command, the engine says the
// same of them, one warn line "hook sandbox: NONE AVAILABLE, hook
// commands run unconfined".
func TestAutoWithNoBackendWarnsLoudly(t *testing.T) {
	h := newServeHome(t, "scripted:demo")
	hooksFile := filepath.Join(t.TempDir(), "hooks.json")
	if err := os.WriteFile(hooksFile, []byte(`{"hooks": {"pre_tool_use": [{"name": "audit", "command": "/bin/true"}]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	h.extraEnv = []string{"PATH=" + t.TempDir(), // no bwrap (nor anything else)
		"FLOE_HOOKS=" + hooksFile}
	// floe serve through this test binary as the seccomp wrapper.
	cmd := exec.Command(os.Args[0], floeBin, "serve")
	cmd.Env = []string{noLandlockEnv + "=1"}
	p := h.startCmd(cmd, "floe serve (no Landlock, no bwrap)")
	runnerStarted(t, p)
	logged(t, p, `"engine started"`) // after it opened its hooks' sandbox
	p.stop()
	warns := map[string][]map[string]any{}
	for _, l := range strings.Split(p.errs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			continue
		}
		switch m["message"] {
		case "tool sandbox", "hook sandbox":
			t.Errorf("an info line claims a sandbox: %s", l)
		case "tool sandbox: NONE AVAILABLE, tools run unconfined":
			warns["tool"] = append(warns["tool"], m)
		case "hook sandbox: NONE AVAILABLE, hook commands run unconfined":
			warns["hook"] = append(warns["hook"], m)
		}
	}
	for _, what := range []string{"tool", "hook"} {
		if len(warns[what]) != 1 {
			t.Fatalf("%d %s sandbox NONE AVAILABLE lines, want 1\nstderr:\n%s", len(warns[what]), what, p.errs.String())
		}
		w := warns[what][0]
		reason, _ := w["reason"].(string)
		if w["level"] != "warn" || w["sandbox"] != "off" || !strings.Contains(reason, "UNCONFINED") ||
			!strings.Contains(reason, "bwrap not found") || !strings.Contains(reason, "no Landlock") {
			t.Fatalf("the %s warning %v, want level warn, sandbox off, a reason naming both backends' failures", what, w)
		}
	}
}

// runnerStarted waits (bounded: two minutes) for serve's tool runner to
// log that it started, which it does after it opened and logged its
// sandbox, so a stop that follows does not come first.
func runnerStarted(t *testing.T, p *proc) {
	t.Helper()
	logged(t, p, `"toolrunner started"`)
}

// logged waits (bounded: two minutes) until p's stderr holds s.
func logged(t *testing.T, p *proc, s string) {
	t.Helper()
	for start := time.Now(); !strings.Contains(p.errs.String(), s); time.Sleep(50 * time.Millisecond) {
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v\nstderr:\n%s", p.name, p.err, p.errs.String())
		default:
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("%s: no %s within 2 min\nstderr:\n%s", p.name, s, p.errs.String())
		}
	}
}
