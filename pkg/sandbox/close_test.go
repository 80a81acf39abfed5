package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Close ends everything a Sandbox started: the calls still running (and
// what they daemonized), the spawner thread, the PID namespaces' inits and
// the goroutines watching them, and it releases the files it opened. A
// start after Close fails.
func TestCloseEndsEveryCallGoroutineAndFile(t *testing.T) {
	for _, b := range []Backend{Landlock, Bwrap} {
		t.Run(string(b), func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			before := openFiles(t)
			s, err := New(Config{Backend: b})
			if err != nil {
				if os.Getenv("FLOE_TEST_SANDBOX_OPTIONAL") != "" {
					t.Skip(err)
				}
				t.Fatal(err)
			}
			defer s.Close() // a failed check must not leave it running
			ws := t.TempDir()
			// A finished call (its namespace back in the pool, the next
			// built ahead) and a running one with a daemon.
			if _, ex := run(t, t.Context(), s, ws, "true"); ex.Code != 0 || ex.Error != "" {
				t.Fatalf("exit %+v", ex)
			}
			mark := fmt.Sprintf("1000.%d77", os.Getpid())
			p, err := s.Command(t.Context(), Spec{Argv: []string{"bash", "-c", fmt.Sprintf("(setsid sleep %s >/dev/null 2>&1 </dev/null &); echo started; sleep 1000", mark)},
				Workspace: ws, Env: []string{"PATH=/usr/bin:/bin"}})
			if err != nil {
				t.Fatal(err)
			}
			out, err := p.Cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			if line, _ := bufio.NewReader(out).ReadString('\n'); line != "started\n" {
				t.Fatalf("running call: %q", line)
			}
			for deadline := time.Now().Add(10 * time.Second); len(daemonized(mark)) == 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					p.Cmd.Process.Kill()
					p.Cmd.Wait()
					t.Fatal("the call's daemon is not running")
				}
			}
			// The caller waits for its call as Close kills it (a PID
			// namespace ends once its last process is reaped).
			waited := make(chan error, 1)
			go func() { waited <- p.Cmd.Wait() }()
			closed := make(chan struct{})
			go func() { s.Close(); close(closed) }()
			select {
			case <-closed:
			case <-time.After(30 * time.Second):
				t.Fatal("Close did not return within 30 s")
			}
			// At once, not eventually (as goleak's retries would).
			if g := sandboxGoroutines(); len(g) > 0 {
				t.Errorf("goroutines of the sandbox still running after Close:\n%s", strings.Join(g, "\n\n"))
			}
			select {
			case <-waited:
			case <-time.After(30 * time.Second):
				t.Fatal("the running call outlived Close")
			}
			p.Exit(nil)
			p.Close()
			waitGone(t, mark, 2*time.Second)
			s.Close() // again: nothing
			q, err := s.Command(t.Context(), Spec{Argv: []string{"true"}, Workspace: ws, Env: []string{"PATH=/usr/bin:/bin"}})
			if err == nil {
				err = q.Start()
				if err == nil {
					q.Cmd.Wait()
				}
				q.Close()
			}
			if err == nil {
				t.Error("a start after Close succeeded")
			}
			if after := openFiles(t); after != before {
				t.Errorf("open files: %d before New, %d after Close", before, after)
			}
		})
	}
}

// sandboxGoroutines returns the stacks of the goroutines this package
// started, the tests' own aside.
func sandboxGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		i := strings.LastIndex(g, "created by ")
		if i < 0 {
			continue
		}
		by := g[i:]
		if strings.Contains(by, "floe.dev/pkg/sandbox.") && !strings.Contains(by, "sandbox.Test") {
			out = append(out, g)
		}
	}
	return out
}

// openFiles counts this process's open file descriptors.
func openFiles(t *testing.T) int {
	t.Helper()
	d, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range d {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && !strings.HasPrefix(l, "/proc/") {
			n++
		}
	}
	return n
}

// Calls of one Workspace share its view (direct.go) but never each
// other's /tmp, even running at the same time: each writes a file into its
// /tmp and, while all of them run, none sees another's; the Workspace is
// shared, and a Workspace under the host's /tmp is in each call's /tmp.
func TestConcurrentCallsOfAWorkspaceKeepTheirOwnTmp(t *testing.T) {
	const n = 8
	for b, s := range backends(t, Config{}) {
		t.Run(string(b), func(t *testing.T) {
			ws := t.TempDir()
			var wg sync.WaitGroup
			outs := make([]string, n)
			for i := range n {
				wg.Go(func() {
					// Each waits until all have written their mark.
					cmd := fmt.Sprintf(`echo %d > /tmp/mark-%d; touch %s/ready-%d
						for k in $(seq 200); do [ $(ls %s | grep -c ready-) -ge %d ] && break; sleep 0.05; done
						ls /tmp | grep mark-; echo ws=$(ls %s | grep -c ready-)`, i, i, ws, i, ws, n, ws)
					outs[i], _ = run(t, t.Context(), s, ws, cmd)
				})
			}
			wg.Wait()
			for i, out := range outs {
				if strings.TrimSpace(out) != fmt.Sprintf("mark-%d\nws=%d", i, n) {
					t.Errorf("call %d sees in /tmp and the Workspace:\n%s", i, out)
				}
			}
		})
	}
}

// A credentials file replaced after a call (a rotation by rename) is
// masked for the next call too: the Workspace's view, built once, is
// rebuilt when a file it hides changed.
func TestAReplacedHiddenFileStaysHidden(t *testing.T) {
	// Out of /tmp, whose paths each call binds itself.
	dir, err := os.MkdirTemp("/var/tmp", "floe-hide-test-")
	if err != nil {
		t.Skip(err)
	}
	defer os.RemoveAll(dir)
	pw := filepath.Join(dir, "nats.pw")
	writeFile(t, pw, "OLD-PASSWORD")
	for b, s := range backends(t, Config{Hide: []string{pw}, Read: []string{dir}}) {
		t.Run(string(b), func(t *testing.T) {
			ws := t.TempDir()
			if out, _ := run(t, t.Context(), s, ws, "cat "+pw+"; echo read"); strings.Contains(out, "PASSWORD") || !strings.Contains(out, "read") {
				t.Fatalf("first call: %q", out)
			}
			next := pw + ".new"
			writeFile(t, next, "NEW-PASSWORD")
			if err := os.Rename(next, pw); err != nil {
				t.Fatal(err)
			}
			if out, _ := run(t, t.Context(), s, ws, "cat "+pw+"; echo read"); strings.Contains(out, "PASSWORD") || !strings.Contains(out, "read") {
				t.Errorf("after the file was replaced: %q", out)
			}
		})
	}
}
