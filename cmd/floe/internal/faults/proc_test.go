package faults

import (
	"bytes"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"floe.dev/pkg/procfs"
)

// proc is one child process with its stdout and stderr in a log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has been reaped
	err     error         // Wait's result, set before done closes
}

// startProc starts bin with args and env; its output goes to dir/name.log.
// The caller stops it (stop, kill) or leaves it to the owner's cleanup.
func startProc(t testing.TB, dir, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: cleanup can end what its tools started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for the process to exit, at most d.
func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// kill sends SIGKILL to the process alone (not the tools it started: a
// crashed runner's tool may outlive it) and waits for it to be reaped.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	if !p.wait(10 * time.Second) {
		t.Fatalf("%s (pid %d) not reaped 10s after SIGKILL", p.name, p.pid())
	}
}

// stop sends SIGTERM and waits up to grace, then kills the process group.
// It reports whether the process exited on SIGTERM.
func (p *proc) stop(grace time.Duration) bool {
	if p.exited() {
		p.killGroup()
		return true
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	clean := p.wait(grace)
	p.killGroup()
	if !clean {
		p.wait(10 * time.Second)
	}
	return clean
}

// killGroup kills whatever is left in the process's group (tools). The
// process has usually been reaped by then, and once its group is empty
// its pid may be reused (pids wrap at 32768 here, and several test
// binaries and loops run at once), even as another process group's id: a
// blind kill of the group then SIGKILLs someone else's processes, such as
// the `timeout` of a scripts/failover-loop run with its test binary (a
// run whose log just stops). Only a group with a member in this test's
// session is killed.
func (p *proc) killGroup() {
	if groupInSession(p.pid()) {
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	}
}

// groupInSession reports whether process group pgid has a live member in
// the caller's session (a zombie, dead but not reaped, has nothing to
// kill).
func groupInSession(pgid int) bool {
	self, ok := procfs.Stat(os.Getpid())
	if !ok {
		return false
	}
	for _, p := range procfs.All() {
		if p.Live() && p.PGID == pgid && p.Session == self.Session {
			return true
		}
	}
	return false
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// tail returns the last n lines of the log.
func (p *proc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitLog waits until the log contains s; it fails if the process exits or
// d passes first.
func (p *proc) waitLog(t testing.TB, s string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if strings.Contains(p.log(), s) {
			return
		}
		if p.exited() {
			t.Fatalf("%s exited (%v) before logging %q:\n%s", p.name, p.err, s, p.tail(30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %v:\n%s", p.name, s, d, p.tail(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// procs is a set of processes stopped together at cleanup.
type procs struct {
	mu   sync.Mutex
	list []*proc
}

func (ps *procs) add(p *proc) {
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
}

// stopAll stops every process at once (SIGTERM, then SIGKILL after grace)
// and waits for them.
func (ps *procs) stopAll(grace time.Duration) {
	ps.mu.Lock()
	list := append([]*proc(nil), ps.list...)
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop(grace)
		}()
	}
	wg.Wait()
}

// dump logs the tail of every process's log (for a failed test).
func (ps *procs) dump(t testing.TB) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.list {
		t.Logf("--- %s (pid %d) log tail:\n%s", p.name, p.pid(), p.tail(25))
	}
}

// count is how many times s occurs in the logs of the processes whose
// name starts with prefix.
func (ps *procs) count(prefix, s string) int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	n := 0
	for _, p := range ps.list {
		if strings.HasPrefix(p.name, prefix) {
			n += strings.Count(p.log(), s)
		}
	}
	return n
}

// keepLogs copies every process's log into dir (FAULTS_DUMP, a debugging
// aid: the test's own directory is removed at cleanup).
func (ps *procs) keepLogs(t testing.TB, dir string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Log(err)
		return
	}
	for _, p := range ps.list {
		if b, err := os.ReadFile(p.logPath); err == nil {
			_ = os.WriteFile(filepath.Join(dir, filepath.Base(p.logPath)), b, 0o644)
		}
	}
}

// Ports handed out by freePort, never twice in one test binary.
var (
	portsMu sync.Mutex
	ports   = map[int]bool{}
)

// freePort returns a TCP port free on 127.0.0.1 right now, below the
// kernel's ephemeral range (32768 and up on Linux): a port the kernel picks
// for ":0" can meanwhile become the source port of an outgoing connection
// (a node's route to another), and the node meant to listen on it fails
// with "address already in use".
func freePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		p := 20000 + mrand.IntN(12000)
		if ports[p] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		ports[p] = true
		return p
	}
	t.Fatal("no free port below the ephemeral range")
	return 0
}

// baseEnv is this process's environment without anything that would
// configure Floe, NATS clients or a model provider, and without HOME.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "HOME", strings.HasPrefix(k, "FLOE_"), strings.HasPrefix(k, "NATS_"),
			strings.HasPrefix(k, "OPENAI_"), strings.HasPrefix(k, "ANTHROPIC_"):
			continue
		}
		env = append(env, kv)
	}
	return append(env, goEnv...)
}

// eventually polls cond every 20ms until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runScript runs a script of the repository with env and returns its
// stdout; stderr is in the error.
func runScript(t testing.TB, d time.Duration, env []string, script string, args ...string) ([]byte, error) {
	t.Helper()
	return runScriptFiles(t, d, env, nil, script, args...)
}

// runScriptFiles is runScript with extra descriptors open in the script
// (fd 3 on), as a caller's shell may have them.
func runScriptFiles(t testing.TB, d time.Duration, env []string, extra []*os.File, script string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(repoRoot, script), args...)
	cmd.ExtraFiles = extra
	cmd.Env = env
	cmd.Dir = repoRoot
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return stdout.Bytes(), fmt.Errorf("%s: %w\nstderr:\n%s", script, err, stderr.String())
		}
		return stdout.Bytes(), nil
	case <-time.After(d):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return stdout.Bytes(), errors.New(script + " did not finish within " + d.String() + "\nstderr:\n" + stderr.String())
	}
}

// killGroup kills the group of a process of this test, and never a group
// of another session that took a reaped process's pid as its id (here
// the group of a process started with setsid stands for it: pid reuse
// itself cannot be forced).
func TestKillGroupSparesOtherSessions(t *testing.T) {
	dir := t.TempDir()
	ours := startProc(t, dir, "ours", "/bin/sh", os.Environ(), "-c", "sleep 60 & wait")
	theirs := exec.Command("setsid", "sleep", "60")
	if err := theirs.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = theirs.Process.Kill(); _ = theirs.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for !groupInSession(ours.pid()) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !groupInSession(ours.pid()) {
		t.Fatal("the group of a process this test started is not found in its session")
	}
	if groupInSession(theirs.Process.Pid) {
		t.Fatal("a group of another session counts as this test's")
	}
	(&proc{name: "theirs", cmd: theirs}).killGroup()
	ours.stop(5 * time.Second)
	if err := theirs.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("killGroup killed another session's process: %v", err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for groupInSession(ours.pid()) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if groupInSession(ours.pid()) {
		t.Error("the group of the stopped process still has members (its sleep)")
	}
}
