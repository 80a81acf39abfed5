package hooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/procfs"
	"floe.dev/pkg/sandbox"
)

// sandboxes returns a Sandbox per backend (landlock, bwrap) of cfg; a
// backend the host lacks is skipped only with FLOE_TEST_SANDBOX_OPTIONAL
// (CI installs bubblewrap, so there both run).
func sandboxes(t *testing.T, cfg sandbox.Config) map[sandbox.Backend]*sandbox.Sandbox {
	t.Helper()
	out := map[sandbox.Backend]*sandbox.Sandbox{}
	for _, b := range []sandbox.Backend{sandbox.Landlock, sandbox.Bwrap} {
		c := cfg
		c.Backend = b
		sb, err := sandbox.New(c)
		if err != nil {
			if os.Getenv("FLOE_TEST_SANDBOX_OPTIONAL") != "" {
				t.Logf("%s: %v", b, err)
				continue
			}
			t.Fatalf("sandbox.New(%s) = %v", b, err)
		}
		t.Cleanup(sb.Close)
		out[b] = sb
	}
	return out
}

// acceptAll returns a loopback listener's port, accepting in the
// background until the test ends.
func acceptAll(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A hook command runs confined exactly like a tool (protocol.md §7): it
// reads and writes its Workspace and a private /tmp, and nothing of
// another Workspace, a Trace, the store, a credentials file or the
// engine's environment; it cannot connect to Floe's ports, while another
// loopback port stays reachable with the network on.
func TestConfinedHookSeesOnlyItsWorkspace(t *testing.T) {
	base := t.TempDir()
	home := filepath.Join(base, "floe-home")
	wsA, wsB := filepath.Join(home, "workspaces", "a"), filepath.Join(home, "workspaces", "b")
	writeFile(t, filepath.Join(wsA, "secret.txt"), "SESSION-A-SECRET")
	writeFile(t, filepath.Join(home, "traces", "s.jsonl"), "TRACE-SECRET")
	writeFile(t, filepath.Join(wsB, "mine.txt"), "mine")
	writeFile(t, filepath.Join(home, "jetstream", "store"), "STORE-SECRET")
	pw := filepath.Join(base, "etc", "nats.pw")
	writeFile(t, pw, "NATS-PASSWORD")
	// The engine's environment as /proc shows it (its start's): a
	// variable a hook is not given stands for its credentials.
	secrets := []string{"SESSION-A-SECRET", "TRACE-SECRET", "STORE-SECRET", "NATS-PASSWORD"}
	environ, _ := os.ReadFile("/proc/self/environ")
	for _, kv := range strings.Split(string(environ), "\x00") {
		if k, v, _ := strings.Cut(kv, "="); len(v) >= 6 && !slices.Contains(passedEnv, k) {
			secrets = append(secrets, kv)
			break
		}
	}
	if len(secrets) == 4 {
		t.Log("the test's environment has no variable a hook is not given: /proc environ not checked")
	}
	floePort, otherPort := acceptAll(t), acceptAll(t)
	connect := func(port int) string {
		return fmt.Sprintf("if (exec 3<>/dev/tcp/127.0.0.1/%d) 2>/dev/null; then echo OPEN-%d; else echo CLOSED-%d; fi", port, port, port)
	}
	probe := script(t, strings.Join([]string{
		"exec > findings.txt 2>&1",
		"cat " + filepath.Join(wsA, "secret.txt"),
		"cat " + filepath.Join(home, "traces", "s.jsonl"),
		"cat " + filepath.Join(home, "jetstream", "store"),
		"cat " + pw,
		"cat /proc/[0-9]*/environ | tr '\\0' '\\n'",
		"tr '\\0' '\\n' < /proc/$PPID/environ",
		fmt.Sprintf("tr '\\0' '\\n' < /proc/%d/environ", os.Getpid()),
		"echo evil > " + filepath.Join(home, "evil"),
		"echo tmp > /tmp/t && cat /tmp/t",
		connect(floePort), connect(otherPort), connect(4222),
		`echo '{"decision":"allow"}' >&3`,
	}, "\n"))
	// The probe runs in bash (for /dev/tcp); its answer goes to the hook's
	// real stdout, kept as fd 3.
	wrapper := script(t, "exec 3>&1\nexec /bin/bash \"$1\"")
	for b, sb := range sandboxes(t, sandbox.Config{DenyPorts: []int{floePort}, Hide: []string{pw}, Read: []string{filepath.Dir(pw)}}) {
		t.Run(string(b), func(t *testing.T) {
			r := New(mustParse(t, map[string]any{"hooks": map[string]any{"pre_tool_use": []Hook{{Name: "probe", Command: wrapper}}}}), nil, sb)
			// The wrapper runs the probe by its path: both are files the
			// hook may read, the probe only because the wrapper names it.
			r.cfg.Hooks["pre_tool_use"][0].Args = []string{probe}
			got := r.Run(context.Background(), preTool(wsB))
			if len(got.Records) != 1 || got.Records[0].Decision != omni.DecisionAllow {
				t.Fatalf("Run = %+v", got)
			}
			b, err := os.ReadFile(filepath.Join(wsB, "findings.txt"))
			if err != nil {
				t.Fatalf("the hook wrote nothing to its Workspace: %v", err)
			}
			out := string(b)
			for _, secret := range secrets {
				if strings.Contains(out, secret) {
					t.Errorf("the hook read %s:\n%s", secret, out)
				}
			}
			for _, want := range []string{"tmp\n", fmt.Sprintf("CLOSED-%d", floePort), "CLOSED-4222", fmt.Sprintf("OPEN-%d", otherPort), "FLOE_HOOK=pre_tool_use"} {
				if !strings.Contains(out, want) {
					t.Errorf("findings lack %q:\n%s", want, out)
				}
			}
			if _, err := os.Stat(filepath.Join(home, "evil")); err == nil {
				t.Error("the hook wrote under $FLOE_HOME")
			}
		})
	}
}

// Every process a confined hook starts ends with it: a `setsid sleep`
// backgrounded by a hook that answers at once, and one started by a hook
// that hangs until its time limit, are gone within 2 s of the hook's end.
func TestConfinedHookLeavesNothingBehind(t *testing.T) {
	for b, sb := range sandboxes(t, sandbox.Config{}) {
		t.Run(string(b), func(t *testing.T) {
			mark := fmt.Sprintf("1000.%d%d1", os.Getpid(), len(b))
			quick := script(t, "setsid sleep "+mark+" >/dev/null 2>&1 < /dev/null &\necho '{\"decision\":\"allow\"}'")
			hangMark := fmt.Sprintf("1000.%d%d2", os.Getpid(), len(b))
			hang := script(t, "(setsid nohup sleep "+hangMark+" >/dev/null 2>&1 &)\nsleep 60")
			r := New(mustParse(t, map[string]any{"hooks": map[string]any{"pre_tool_use": []Hook{
				{Name: "quick", Command: quick},
				{Name: "hang", Command: hang, TimeoutMs: 1500},
			}}}), nil, sb)
			start := time.Now()
			got := r.Run(context.Background(), preTool(t.TempDir()))
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("the hooks held the call %s", d)
			}
			want := []omni.HookRecord{
				{Point: "pre_tool_use", Name: "quick", Decision: "allow", ToolCallID: "call_1"},
				{Point: "pre_tool_use", Name: "hang", Reason: "hook failed: timed out after 1.5s", ToolCallID: "call_1"},
			}
			if fmt.Sprint(got.Records) != fmt.Sprint(want) {
				t.Fatalf("Run = %+v, want records %+v", got, want)
			}
			end := time.Now()
			for _, m := range []string{mark, hangMark} {
				bustest.Eventually(t, 2*time.Second, "the hook's daemonized sleep "+m+" to be gone", func() bool { return len(procfs.WithArgs(m)) == 0 })
			}
			t.Logf("%s: leftovers gone %v after the hooks ended", b, time.Since(end).Round(time.Millisecond))
		})
	}
}

// A confined hook runs under the tools' limits: one that starts more
// processes than FLOE_TOOL_PIDS allows fails naming the limit.
func TestConfinedHookOverALimitFailsNamingIt(t *testing.T) {
	for b, sb := range sandboxes(t, sandbox.Config{Pids: 16}) {
		t.Run(string(b), func(t *testing.T) {
			forks := script(t, "for i in $(seq 64); do sleep 30 & done; wait")
			r := New(mustParse(t, map[string]any{"hooks": map[string]any{"stop": []Hook{{Name: "forks", Command: forks, Required: true}}}}), nil, sb)
			got := r.Run(context.Background(), Input{Point: omni.HookStop, SessionID: "s1", TaskID: "t1", Workspace: t.TempDir()})
			want := "hook failed: killed over the process limit of 16 (FLOE_TOOL_PIDS)"
			if len(got.Records) != 1 || !strings.HasPrefix(got.Records[0].Reason, want) || got.Records[0].Decision != omni.DecisionStop {
				t.Fatalf("Run = %+v, want one stop record %q", got, want)
			}
		})
	}
}

// The semantics hold confined: the decision table of TestCommandHooksDecide
// again under each backend (exit statuses, stderr, garbage, required).
func TestConfinedHooksDecideAlike(t *testing.T) {
	for b, sb := range sandboxes(t, sandbox.Config{}) {
		t.Run(string(b), func(t *testing.T) {
			ws := t.TempDir()
			r := New(mustParse(t, map[string]any{"hooks": map[string]any{"pre_tool_use": []Hook{
				{Name: "crash", Command: script(t, `echo boom >&2; exit 3`)},
				{Name: "junk", Command: script(t, `echo 'not json'`)},
				{Name: "no-push", Command: script(t, `grep -q 'push origin main' && echo '{"decision":"deny","reason":"pushes to main are not allowed"}'; exit 0`)},
				{Name: "where", Command: script(t, `cat >/dev/null; printf '{"reason":"%s %s"}' "$(pwd)" "$TMPDIR"`)},
			}}}), nil, sb)
			got := r.Run(context.Background(), preTool(ws))
			want := Outcome{Deny: true, By: "no-push", Reason: "pushes to main are not allowed", Records: []omni.HookRecord{
				{Point: "pre_tool_use", Name: "crash", Reason: "hook failed: exit status 3: boom", ToolCallID: "call_1"},
				{Point: "pre_tool_use", Name: "junk", Reason: "hook failed: answer: not a JSON object: not json", ToolCallID: "call_1"},
				{Point: "pre_tool_use", Name: "no-push", Decision: "deny", Reason: "pushes to main are not allowed", ToolCallID: "call_1"},
				{Point: "pre_tool_use", Name: "where", Reason: ws + " /tmp", ToolCallID: "call_1"},
			}}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
				t.Fatalf("Run =\n %+v\nwant\n %+v", got, want)
			}
		})
	}
}

// A backend named in FLOE_SANDBOX that the host lacks: no hook runs
// unconfined in its place (sandbox.New fails, and the engine with it).
func TestHookSandboxIsFailClosed(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no bwrap
	_, err := sandbox.New(sandbox.Config{Backend: sandbox.Bwrap})
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("sandbox.New(bwrap) without bwrap = %v, want ErrUnavailable", err)
	}
}
