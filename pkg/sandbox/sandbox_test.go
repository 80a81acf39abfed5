package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// backends returns a Sandbox per backend this host provides; a backend it
// cannot is skipped only when FLOE_TEST_SANDBOX_OPTIONAL is set (CI
// installs bubblewrap, so there both run).
func backends(t *testing.T, cfg Config) map[Backend]*Sandbox {
	t.Helper()
	out := map[Backend]*Sandbox{}
	for _, b := range []Backend{Landlock, Bwrap} {
		c := cfg
		c.Backend = b
		s, err := New(c)
		if err != nil {
			if os.Getenv("FLOE_TEST_SANDBOX_OPTIONAL") != "" {
				t.Logf("%s: %v", b, err)
				continue
			}
			t.Fatalf("New(%s) = %v", b, err)
		}
		t.Cleanup(s.Close)
		out[b] = s
	}
	return out
}

// run runs bash -c cmd confined in ws and returns its merged output and
// exit.
func run(t *testing.T, ctx context.Context, s *Sandbox, ws, cmd string, env ...string) (string, Exit) {
	t.Helper()
	p, err := s.Command(ctx, Spec{Argv: []string{"bash", "-c", cmd}, Workspace: ws,
		Env: append([]string{"PATH=/usr/bin:/bin", "HOME=" + os.Getenv("HOME")}, env...)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var out bytes.Buffer
	p.Cmd.Stdout, p.Cmd.Stderr = &out, &out
	err = p.Run()
	return out.String(), p.Exit(err)
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

func TestConfinedCallSeesOnlyItsWorkspaceSystemAndTmp(t *testing.T) {
	base := t.TempDir()
	home := filepath.Join(base, "floe-home")
	wsA, wsB := filepath.Join(home, "workspaces", "a"), filepath.Join(home, "workspaces", "b")
	writeFile(t, filepath.Join(wsA, "secret.txt"), "SESSION-A-SECRET")
	writeFile(t, filepath.Join(home, "traces", "s.jsonl"), "TRACE-SECRET")
	writeFile(t, filepath.Join(home, "jetstream", "store"), "STORE-SECRET")
	pw := filepath.Join(base, "etc-like", "nats.pw")
	writeFile(t, pw, "NATS-PASSWORD")
	writeFile(t, filepath.Join(wsB, "mine.txt"), "mine")
	hostTmp, err := os.MkdirTemp("", "floe-host-tmp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(hostTmp)
	writeFile(t, filepath.Join(hostTmp, "x"), "HOST-TMP-SECRET")
	t.Setenv("FLOE_TEST_SERVICE_SECRET", "SERVICE-ENV-SECRET")

	for b, s := range backends(t, Config{Hide: []string{pw}, Read: []string{filepath.Dir(pw)}}) {
		t.Run(string(b), func(t *testing.T) {
			cmd := strings.Join([]string{
				"cat " + filepath.Join(wsA, "secret.txt"),
				"cat " + filepath.Join(home, "traces", "s.jsonl"),
				"cat " + filepath.Join(home, "jetstream", "store"),
				"cat " + pw,
				"cat " + filepath.Join(hostTmp, "x"),
				"cat /proc/*/environ",
				"ls -la " + home,
				"echo written > " + filepath.Join(home, "evil"),
				"echo ok > " + filepath.Join(wsB, "out.txt"),
				"echo tmp > /tmp/t && cat /tmp/t",
				"cat mine.txt",
				"echo TMPDIR=$TMPDIR",
			}, "; ")
			out, ex := run(t, t.Context(), s, wsB, cmd)
			for _, secret := range []string{"SESSION-A-SECRET", "TRACE-SECRET", "STORE-SECRET", "NATS-PASSWORD", "HOST-TMP-SECRET", "SERVICE-ENV-SECRET"} {
				if strings.Contains(out, secret) {
					t.Errorf("confined call read %s:\n%s", secret, out)
				}
			}
			for _, want := range []string{"tmp\n", "mine", "TMPDIR=/tmp"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if _, err := os.Stat(filepath.Join(home, "evil")); err == nil {
				t.Errorf("confined call wrote under $FLOE_HOME")
			}
			if b, err := os.ReadFile(filepath.Join(wsB, "out.txt")); err != nil || string(b) != "ok\n" {
				t.Errorf("workspace write: %q, %v", b, err)
			}
			if ex.Error != "" {
				t.Errorf("exit %+v", ex)
			}
		})
	}
}

// listen returns a loopback listener's port, accepting in the background.
func listen(t *testing.T) int {
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

func TestFloePortsAreClosedOtherPortsFollowTheNetworkSetting(t *testing.T) {
	floePort, otherPort := listen(t), listen(t)
	connect := func(port int) string {
		return fmt.Sprintf("if (exec 3<>/dev/tcp/127.0.0.1/%d) 2>/dev/null; then echo OPEN-%d; else echo CLOSED-%d; fi", port, port, port)
	}
	cmd := connect(floePort) + "; " + connect(otherPort) + "; " + connect(4222)
	for _, off := range []bool{false, true} {
		for b, s := range backends(t, Config{DenyPorts: []int{floePort}, NetworkOff: off}) {
			t.Run(fmt.Sprintf("%s/network-off=%v", b, off), func(t *testing.T) {
				out, _ := run(t, t.Context(), s, t.TempDir(), cmd)
				want := []string{fmt.Sprintf("CLOSED-%d", floePort), "CLOSED-4222", fmt.Sprintf("OPEN-%d", otherPort)}
				if off {
					want[2] = fmt.Sprintf("CLOSED-%d", otherPort)
				}
				for _, w := range want {
					if !strings.Contains(out, w) {
						t.Errorf("output %q, want %s", out, w)
					}
				}
			})
		}
	}
}

// daemonized returns the host pids of processes whose arguments include
// arg.
func daemonized(arg string) []int {
	names, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(b), "\x00") {
			if a == arg {
				pid, _ := strconv.Atoi(strings.Split(n, "/")[2])
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func waitGone(t *testing.T, arg string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		pids := daemonized(arg)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v (sleep %s) alive %v after the call ended", pids, arg, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestEveryProcessEndsWithTheCall(t *testing.T) {
	for b, s := range backends(t, Config{}) {
		t.Run(string(b), func(t *testing.T) {
			for i, how := range []string{"exit", "timeout", "abort"} {
				mark := fmt.Sprintf("1000.%d%d", os.Getpid(), i)
				cmd := fmt.Sprintf("setsid nohup sleep %s >/dev/null 2>&1 & (sleep %s &) ; echo started", mark, mark)
				if how == "exit" {
					cmd += "; sleep 3"
				} else {
					cmd += "; sleep 1000"
				}
				ctx, cancel := context.WithCancel(t.Context())
				if how == "timeout" {
					ctx, cancel = context.WithTimeout(t.Context(), 2*time.Second)
				}
				p, err := s.Command(ctx, Spec{Argv: []string{"bash", "-c", cmd}, Workspace: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}})
				if err != nil {
					t.Fatal(err)
				}
				r, w, _ := os.Pipe()
				p.Cmd.Stdout = w
				if err := p.Start(); err != nil {
					t.Fatal(err)
				}
				w.Close()
				buf := make([]byte, 16)
				r.Read(buf) // "started"
				deadline := time.Now().Add(5 * time.Second)
				for len(daemonized(mark)) < 2 && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if n := len(daemonized(mark)); n < 2 {
					t.Fatalf("%s: %d daemons started, want 2", how, n)
				}
				if how == "abort" {
					cancel()
				}
				p.Cmd.Wait()
				ended := time.Now()
				waitGone(t, mark, 2*time.Second)
				t.Logf("%s: daemons gone %v after the call's end", how, time.Since(ended).Round(time.Millisecond))
				r.Close()
				p.Close()
				cancel()
			}
		})
	}
}

func TestLimitsEndTheCallNamingTheLimit(t *testing.T) {
	for b, s := range backends(t, Config{MemoryMB: 256, Pids: 64}) {
		t.Run(string(b), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			// Touch 512 MB: tail keeps a line with no newline whole.
			_, ex := run(t, ctx, s, t.TempDir(), "head -c 512M /dev/zero | tail -n 1 >/dev/null; echo survived")
			if ex.Limit != "memory" {
				t.Errorf("512 MB allocation: exit %+v, want the memory limit", ex)
			}
			_, ex = run(t, ctx, s, t.TempDir(), "for i in $(seq 200); do sleep 100 & done; wait")
			if ex.Limit != "processes" {
				t.Errorf("200 processes: exit %+v, want the process limit", ex)
			}
		})
	}
}

func TestNamedBackendTheHostLacksIsAnError(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no bwrap
	probes.Delete(probeKey{Bwrap, false})
	defer probes.Delete(probeKey{Bwrap, false})
	_, err := New(Config{Backend: Bwrap})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "bwrap") {
		t.Fatalf("New(bwrap) without bwrap = %v, want ErrUnavailable naming bwrap", err)
	}
}

// 50 aborts of commands that background grandchildren leave no orphan.
func TestFiftyAbortsLeaveNoOrphan(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Backend() == Off {
		t.Skip("no sandbox backend on this host")
	}
	mark := fmt.Sprintf("1000.%d77", os.Getpid())
	cmd := fmt.Sprintf("(setsid nohup sleep %s >/dev/null 2>&1 &); (sleep %s &); echo started; sleep 1000", mark, mark)
	for i := range 50 {
		ctx, cancel := context.WithCancel(t.Context())
		p, err := s.Command(ctx, Spec{Argv: []string{"bash", "-c", cmd}, Workspace: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		r, w, _ := os.Pipe()
		p.Cmd.Stdout = w
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		buf := make([]byte, 16)
		r.Read(buf) // "started": the grandchildren are on their way
		cancel()
		p.Cmd.Wait()
		r.Close()
		p.Close()
		if i%10 == 9 {
			t.Logf("%d aborts", i+1)
		}
	}
	waitGone(t, mark, 2*time.Second)
}

// directSandbox is a landlock Sandbox that starts its calls directly
// (direct.go), closed at the test's end; the test is skipped where the
// direct start cannot run (not root, no procfs per PID namespace).
func directSandbox(t *testing.T) *Sandbox {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the direct start needs root")
	}
	if err := procPidnsWorks(); err != nil {
		t.Skipf("the direct start needs a procfs per PID namespace (Linux 6.15) and mounts: %v", err)
	}
	s, err := New(Config{Backend: Landlock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if !s.sp.direct {
		t.Fatal("as root, the landlock backend does not start calls directly")
	}
	return s
}

// As root the landlock backend starts calls directly (direct.go): check
// that it does, and that the call holds no capability to undo its
// confinement (mount, umount), cannot reach the host's tree through its
// namespace's init (/proc/1/root), and is not a namespace init itself
// (`kill $$` ends it).
func TestDirectStartGivesNoWayOut(t *testing.T) {
	s := directSandbox(t)
	cmd := strings.Join([]string{
		"grep -E '^Cap(Prm|Eff|Bnd|Amb):' /proc/self/status",
		"ls /proc/1/root/ >/dev/null 2>&1 && echo HOST-ROOT",
		"tr '\\0' '\\n' < /proc/1/environ 2>/dev/null | grep -q . && echo INIT-ENV",
		"mkdir -p /tmp/m && mount -t tmpfs x /tmp/m 2>/dev/null && echo MOUNTED",
		"umount -l /proc 2>/dev/null && echo UNMOUNTED",
		"echo pid=$$",
	}, "; ")
	out, ex := run(t, t.Context(), s, t.TempDir(), cmd)
	for _, bad := range []string{"HOST-ROOT", "INIT-ENV", "MOUNTED", "pid=1\n"} {
		if strings.Contains(out, bad) {
			t.Errorf("confined call: %s\n%s", bad, out)
		}
	}
	for _, c := range []string{"CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if !strings.Contains(out, c+":\t0000000000000000") {
			t.Errorf("%s is not empty:\n%s", c, out)
		}
	}
	if ex.Code != 0 || ex.Error != "" {
		t.Errorf("exit %+v\n%s", ex, out)
	}
	_, ex = run(t, t.Context(), s, t.TempDir(), "kill -TERM $$; sleep 5")
	if ex.Signal != "terminated" {
		t.Errorf("kill -TERM $$: exit %+v, want the signal", ex)
	}
}

// A backend that reuses a PID namespace across calls (the direct start)
// must leave nothing of one call to the next: no process, no System V
// IPC object.
func TestNextCallSeesNothingOfTheLast(t *testing.T) {
	mark := fmt.Sprintf("1000.%d88", os.Getpid())
	for b, s := range backends(t, Config{}) {
		t.Run(string(b), func(t *testing.T) {
			ws := t.TempDir()
			out, ex := run(t, t.Context(), s, ws, fmt.Sprintf("(setsid sleep %s >/dev/null 2>&1 </dev/null &); ipcmk -Q >/dev/null 2>&1; ipcs -q | grep -c 0x; echo started", mark))
			if !strings.Contains(out, "started") || ex.Code != 0 {
				t.Fatalf("first call: %q %+v", out, ex)
			}
			waitGone(t, mark, 2*time.Second)
			out, _ = run(t, t.Context(), s, ws, "for p in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $p; echo; done; ipcs -q | grep -c 0x")
			if strings.Contains(out, mark) {
				t.Errorf("the next call sees the last one's daemon:\n%s", out)
			}
			if lines := strings.Split(strings.TrimSpace(out), "\n"); lines[len(lines)-1] != "0" {
				t.Errorf("the next call sees the last one's message queue:\n%s", out)
			}
		})
	}
}

// Closing a Proc closes only what it owns: an unconfined one once closed
// fd 0 (its zero procFD), and with it, later, whatever file took fd 0.
func TestCloseClosesOnlyItsOwnFiles(t *testing.T) {
	if _, err := unix.FcntlInt(0, unix.F_GETFD, 0); err != nil {
		t.Skipf("fd 0 is not open here: %v", err)
	}
	s, err := New(Config{Backend: Off})
	if err != nil {
		t.Fatal(err)
	}
	if _, ex := run(t, t.Context(), s, t.TempDir(), "true"); ex.Code != 0 {
		t.Fatalf("exit %+v", ex)
	}
	if _, err := unix.FcntlInt(0, unix.F_GETFD, 0); err != nil {
		t.Fatalf("fd 0 after an unconfined Proc's Close: %v", err)
	}
}

// procPidnsWorks checks what the direct start needs of the host: a procfs
// created for a given PID namespace (pidns=, Linux 6.15), which also takes
// the right to mount.
func procPidnsWorks() error {
	ns, err := unix.Open("/proc/self/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(ns)
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fs)
	return unix.FsconfigSetFd(fs, "pidns", ns)
}
