package procfs

import (
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// start runs `sh -c 'sleep <marker> & wait'` with env and returns the
// shell; the sleep is its child, the test's grandchild.
func start(t *testing.T, marker string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "sleep "+marker+" & wait")
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestFindsAGrandchildByItsArguments(t *testing.T) {
	const marker = "3017.4242"
	sh := start(t, marker, "PROCFS_TEST_MARK=1")
	var sleep int
	eventually(t, "the sleep to start", func() bool {
		pids := WithArgs("sleep", marker)
		if len(pids) == 1 {
			sleep = pids[0]
		}
		return len(pids) == 1
	})
	if got := WithArgs(marker); !slices.Equal(got, []int{sleep}) {
		t.Errorf("WithArgs(marker) = %v, want [%d]", got, sleep)
	}
	if got := WithArgs(marker, "sleep"); len(got) != 0 {
		t.Errorf("WithArgs in the wrong order = %v, want none", got)
	}
	p, ok := Stat(sleep)
	if !ok || p.PPID != sh.Process.Pid || !p.Live() {
		t.Errorf("Stat(sleep) = %+v, %v; want live, child of %d", p, ok, sh.Process.Pid)
	}
	if !DescendsFrom(sleep, os.Getpid()) || !DescendsFrom(sleep, sh.Process.Pid) || DescendsFrom(sh.Process.Pid, sleep) {
		t.Error("DescendsFrom does not follow the parents")
	}
	if got := Descendants(sh.Process.Pid); !slices.Equal(got, []int{sleep}) {
		t.Errorf("Descendants(sh) = %v, want [%d]", got, sleep)
	}
	if d := Descendants(os.Getpid()); !slices.Contains(d, sleep) || !slices.Contains(d, sh.Process.Pid) {
		t.Errorf("Descendants(test) = %v, want the shell and the sleep", d)
	}
	if !slices.Contains(Environ(sleep), "PROCFS_TEST_MARK=1") {
		t.Error("Environ(sleep) lacks the variable the shell got")
	}
	if a := Args(sleep); !slices.Equal(a, []string{"sleep", marker}) {
		t.Errorf("Args(sleep) = %q", a)
	}

	_ = sh.Process.Kill() // the sleep is orphaned, then killed
	_ = sh.Wait()
	if err := syscall.Kill(sleep, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sleep to end", func() bool { return !Alive(sleep) && len(WithArgs(marker)) == 0 })
}

func TestAZombieIsNotAlive(t *testing.T) {
	cmd := exec.Command("sh", "-c", "exit 0")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	// Not reaped yet: a zombie until Wait.
	eventually(t, "the shell to exit", func() bool { p, ok := Stat(pid); return ok && p.State == "Z" })
	if Alive(pid) || len(Args(pid)) != 0 || slices.Contains(Descendants(os.Getpid()), pid) {
		t.Errorf("a zombie counts as alive (Args %q)", Args(pid))
	}
	_ = cmd.Wait()
	if _, ok := Stat(pid); ok {
		t.Errorf("Stat(%d) found a reaped process", pid)
	}
}

func TestStatReadsOddNames(t *testing.T) {
	p, ok := Stat(os.Getpid())
	if !ok || p.PID != os.Getpid() || p.PPID != os.Getppid() || p.State == "" {
		t.Errorf("Stat(self) = %+v, %v", p, ok)
	}
	if p.PGID != syscall.Getpgrp() {
		t.Errorf("Stat(self) group %d, want %d", p.PGID, syscall.Getpgrp())
	}
	// A new session's leader is its own group and session.
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	if l, ok := Stat(pid); !ok || l.PGID != pid || l.Session != pid {
		t.Errorf("Stat(session leader %d) = %+v, want its own group and session", pid, l)
	}
	if _, ok := Stat(-1); ok {
		t.Error("Stat(-1) found a process")
	}
	if !HasArgs([]string{"a", "b", "c"}, "b", "c") || HasArgs([]string{"a", "b"}, "b", "c") || !HasArgs(nil) {
		t.Error("HasArgs")
	}
}
