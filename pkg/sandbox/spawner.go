package sandbox

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// spawner is a few OS threads of the toolrunner, each restricted once
// with the network ruleset (and, with the network off, moved into one
// empty network namespace) from which every call's helper (or, direct,
// its command) is forked: a child inherits its thread's Landlock domain
// and network namespace for free, where restricting each call anew costs
// about 0.1 s for the 65k port rules and a new network namespace tens of
// milliseconds. The Go runtime never clones its own threads from a locked
// thread (it uses its template thread), so the rest of the process stays
// unrestricted. A start holds its thread until the command has exec'd (a
// vfork), a millisecond or more on a loaded machine: spawnThreads of them
// let concurrent calls of one runner start in parallel.
type spawner struct {
	req     chan func()
	initReq chan func()   // to the inits' thread (direct)
	quit    chan struct{} // closed by close: the threads end
	threads sync.WaitGroup
	once    sync.Once
	// wg counts the goroutines that watch what the threads started (a
	// namespace init's waiter, a call's watchers); close waits for them.
	wg sync.WaitGroup
	// mu guards started and views. started are the helpers forked from
	// the threads and not yet closed (Proc.Close): close kills them (their
	// calls' namespaces end with them) rather than count on their
	// parent-death signal.
	mu      sync.Mutex
	started map[*os.Process]bool
	netns   bool // the threads are in their own empty network namespace
	netFD   int  // that namespace (-1 without)
	// direct: the threads start calls themselves (direct.go): hostMnt and
	// hostProc are handles on the host's mount namespace and /proc, stage
	// the directory each view's root is built on, views the calls' file
	// trees built once per Workspace.
	direct                              bool
	hostMnt, hostIpc, hostPid, hostProc int
	stage                               string
	pool                                nsPool
	views                               map[string]*view
	viewClock                           uint64
	treesBuilt                          atomic.Int64 // call trees built (tree.go)
}

// spawnThreads is how many threads a spawner starts calls from.
const spawnThreads = 4

func newSpawner(net *os.File, netns, direct bool) (*spawner, error) {
	sp := &spawner{req: make(chan func()), initReq: make(chan func()), quit: make(chan struct{}), netns: netns, netFD: -1, direct: direct,
		hostMnt: -1, hostIpc: -1, hostPid: -1, hostProc: -1, views: map[string]*view{}}
	for i := range spawnThreads {
		// The first thread opens what the others share (the host's
		// namespaces, the empty network namespace) before they start.
		if err := sp.startThread(sp.req, func() error { return sp.prepareThread(net, i == 0) }); err != nil {
			sp.close()
			return nil, err
		}
	}
	if direct {
		// The PID namespaces' inits are started from a thread of their
		// own, with no capability but no Landlock domain: Landlock (ABI 6)
		// scopes signals to a domain and the domains below it, and each
		// spawner thread's restriction is a domain of its own, so an init
		// started from one thread could not kill what a call started from
		// another left behind. No call can signal such an init.
		if err := sp.startThread(sp.initReq, func() error {
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return err
			}
			return dropPrivileges()
		}); err != nil {
			sp.close()
			return nil, err
		}
	}
	return sp, nil
}

// startThread starts one locked thread prepared by prepare, serving req,
// and waits until it is ready.
func (sp *spawner) startThread(req chan func(), prepare func() error) error {
	errc := make(chan error, 1)
	sp.threads.Add(1)
	go func() {
		defer sp.threads.Done()
		// Never unlocked: when the goroutine returns, the thread (and its
		// restrictions) is destroyed, not reused.
		runtime.LockOSThread()
		if err := prepare(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		for {
			select {
			case f := <-req:
				f()
			case <-sp.quit:
				return
			}
		}
	}()
	return <-errc
}

// prepareThread restricts the calling (locked) thread.
func (sp *spawner) prepareThread(net *os.File, first bool) error {
	if sp.direct {
		// Before the network namespace: the host's mount namespace is the
		// one to come back to.
		if err := sp.directThread(first); err != nil {
			return err
		}
	}
	if sp.netns {
		if first {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return err
			}
			fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			sp.netFD = fd
		} else if err := unix.Setns(sp.netFD, unix.CLONE_NEWNET); err != nil {
			return err
		}
	}
	if net != nil {
		if err := restrictSelf(int(net.Fd())); err != nil {
			return err
		}
	}
	return nil
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

// run calls f on a spawner thread and waits for it; errClosed (and f
// not called) once the spawner is closed.
func (sp *spawner) run(f func()) error { return sp.runOn(sp.req, f) }

// runOn calls f on the thread serving req.
func (sp *spawner) runOn(req chan func(), f func()) error {
	done := make(chan struct{})
	select {
	case req <- func() { f(); close(done) }:
	case <-sp.quit:
		return errClosed
	}
	<-done
	return nil
}

// close ends the threads (its views and free PID namespaces released),
// kills the PID namespaces of calls still running (and so every process of
// those calls), and returns once every goroutine the spawner started has
// ended. Idempotent.
func (sp *spawner) close() {
	sp.once.Do(func() {
		close(sp.quit)
		sp.threads.Wait()
		sp.closeDirect()
		if sp.netFD >= 0 {
			unix.Close(sp.netFD)
		}
		sp.pool.killAll()
		sp.mu.Lock()
		for p := range sp.started {
			p.Kill() // by pidfd: never another process, even once reaped
		}
		sp.mu.Unlock()
		sp.wg.Wait()
	})
}
