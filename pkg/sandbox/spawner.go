package sandbox

import (
	"errors"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// spawner is one OS thread of the toolrunner restricted once with the
// network ruleset (and, with the network off, moved into an empty network
// namespace) from which every call's helper is forked: a child inherits
// its thread's Landlock domain and network namespace for free, where
// restricting each call anew costs about 0.1 s for the 65k port rules and
// a new network namespace tens of milliseconds. The Go runtime never
// clones its own threads from a locked thread (it uses its template
// thread), so the rest of the process stays unrestricted. Forks are
// serialized on the thread; a fork takes well under a millisecond.
type spawner struct {
	req   chan func()
	quit  chan struct{} // closed by close: the thread ends
	ended chan struct{} // closed when the thread has ended
	once  sync.Once
	// wg counts the goroutines that watch what the thread started (a
	// namespace init's waiter, a call's watchers); close waits for them.
	wg sync.WaitGroup
	// started are the helpers forked from the thread and not yet closed
	// (Proc.Close): close kills them (their calls' namespaces end with
	// them) rather than count on their parent-death signal.
	mu      sync.Mutex
	started map[*os.Process]bool
	netns   bool // the thread is in its own empty network namespace
	// direct: the thread starts calls itself (direct.go): hostMnt and
	// hostProc are handles on the host's mount namespace and /proc, stage
	// the directory each call's root is built on.
	direct                              bool
	hostMnt, hostIpc, hostPid, hostProc int
	stage                               string
	pool                                nsPool
	// On the thread only: calls' namespaces built ahead, by view
	// (direct.go), and work to do when no call waits.
	ready  map[string]*prepared
	queued map[string]bool
	idle   []func()
}

func newSpawner(net *os.File, netns, direct bool) (*spawner, error) {
	sp := &spawner{req: make(chan func()), quit: make(chan struct{}), ended: make(chan struct{}), netns: netns, direct: direct, hostMnt: -1, hostIpc: -1, hostPid: -1, hostProc: -1, ready: map[string]*prepared{}, queued: map[string]bool{}}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: when the goroutine returns, the thread (and its
		// restrictions) is destroyed, not reused.
		runtime.LockOSThread()
		defer close(sp.ended)
		defer sp.closeDirect()
		if direct {
			// Before the network namespace: the host's mount namespace is
			// the one to come back to.
			if err := sp.directThread(); err != nil {
				errc <- err
				return
			}
		}
		if netns {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				errc <- err
				return
			}
		}
		if net != nil {
			if err := restrictSelf(int(net.Fd())); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
		for {
			var f func()
			if len(sp.idle) > 0 {
				select {
				case f = <-sp.req:
				case <-sp.quit:
					return
				default:
					// No call waits: do the oldest idle work.
					w := sp.idle[0]
					sp.idle = sp.idle[1:]
					w()
					continue
				}
			} else {
				select {
				case f = <-sp.req:
				case <-sp.quit:
					return
				}
			}
			f()
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return sp, nil
}

// track notes a helper started from the thread (untrack when done with
// it); false when the spawner is closed, and the helper then killed.
func (sp *spawner) track(p *os.Process) bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	select {
	case <-sp.quit:
		p.Kill()
		return false
	default:
	}
	if sp.started == nil {
		sp.started = map[*os.Process]bool{}
	}
	sp.started[p] = true
	return true
}

func (sp *spawner) untrack(p *os.Process) {
	sp.mu.Lock()
	delete(sp.started, p)
	sp.mu.Unlock()
}

// errClosed is a start asked of a closed Sandbox.
var errClosed = errors.New("sandbox: closed")

// run calls f on the spawner thread and waits for it; errClosed (and f
// not called) once the spawner is closed.
func (sp *spawner) run(f func()) error {
	done := make(chan struct{})
	select {
	case sp.req <- func() { f(); close(done) }:
	case <-sp.quit:
		return errClosed
	}
	<-done
	return nil
}

// close ends the thread (its namespaces built ahead and free PID
// namespaces released), kills the PID namespaces of calls still running
// (and so every process of those calls), and returns once every
// goroutine the spawner started has ended. Idempotent.
func (sp *spawner) close() {
	sp.once.Do(func() {
		close(sp.quit)
		<-sp.ended
		sp.pool.killAll()
		sp.mu.Lock()
		for p := range sp.started {
			p.Kill() // by pidfd: never another process, even once reaped
		}
		sp.mu.Unlock()
		sp.wg.Wait()
	})
}
