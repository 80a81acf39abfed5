package sandbox

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A kept call tree keeps its IPC namespace for the next call when the
// last call left no IPC object in it (ipc.go); a call that left one —
// a System V message queue, semaphore set or shared memory segment, or a
// POSIX message queue — makes the next call get a new, empty namespace.
// Each call here is the only process of its call and leaves /tmp as it
// was, so nothing else makes its tree fresh.
func TestNextCallInAKeptTreeSeesNoIPCObjectOfTheLast(t *testing.T) {
	s := directSandbox(t)
	ws := t.TempDir()
	// call runs cmd, with inside (if any) run here in the call's IPC
	// namespace meanwhile, and returns how many System V objects the call
	// saw first and its IPC namespace, held open until the test ends (so
	// that no later namespace takes its inode number).
	call := func(cmd string, inside func() error) (objects string, ns unix.Stat_t) {
		t.Helper()
		p, err := s.Command(t.Context(), Spec{Argv: []string{"bash", "-c", "ipcs -q -s -m | grep -c '^0x'; " + cmd + "; read x; true"},
			Workspace: ws, Env: []string{"PATH=/usr/bin:/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		in, err := p.Cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		p.Cmd.Stdout, p.Cmd.Stderr = &out, &out
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/ipc", p.Cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			t.Cleanup(func() { unix.Close(fd) })
			err = unix.Fstat(fd, &ns)
		}
		if err == nil && inside != nil {
			err = runIn(fd, inside)
		}
		in.Close()
		ex := p.Exit(p.Cmd.Wait())
		if err != nil || ex.Code != 0 || ex.Error != "" {
			t.Fatalf("%s: %v; exit %+v\n%s", cmd, err, ex, out.String())
		}
		waitFreeTree(t, s, ws, 10*time.Second)
		return strings.TrimSpace(out.String()), ns
	}
	built := s.sp.treesBuilt.Load()
	_, first := call("true", nil)
	if _, ns := call("true", nil); ns.Ino != first.Ino {
		t.Errorf("a call after one that left no IPC object got a new IPC namespace: not kept")
	}
	for _, make := range []string{"ipcmk -Q", "ipcmk -S 1", "ipcmk -M 4096"} {
		_, last := call(make+" >/dev/null", nil)
		if n, ns := call("true", nil); n != "0" || ns.Ino == last.Ino {
			t.Errorf("after %q the next call sees %s System V objects (same namespace: %v)", make, n, ns.Ino == last.Ino)
		}
	}
	// A POSIX message queue (no tool here makes one).
	_, last := call("true", func() error {
		name := []byte("floe-test\x00")
		q, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(&name[0])), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600, 0, 0, 0)
		if e != 0 {
			return fmt.Errorf("mq_open: %w", e)
		}
		return unix.Close(int(q))
	})
	if _, ns := call("true", nil); ns.Ino == last.Ino {
		t.Errorf("after a POSIX message queue the next call has the same IPC namespace")
	}
	if n := s.sp.treesBuilt.Load() - built; n != 1 {
		t.Errorf("the calls of one Workspace built %d trees, want 1 (kept)", n)
	}
}

// runIn runs f on a thread of its own in the IPC namespace ns; the
// thread ends with it.
func runIn(ns int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.Setns(ns, unix.CLONE_NEWIPC); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}
