package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// nsInitArg is the helper's argument that makes it a pooled PID
// namespace's init (runNSInit) rather than a call's helper.
const nsInitArg = "pidns-init"

// resetTimeout bounds an init's answer to a reset; an init that does not
// answer in time is killed, and its namespace with it.
const resetTimeout = 5 * time.Second

// pidNS is one pooled PID namespace (direct.go): its init, the pipes to
// and from it, and a handle on the namespace.
type pidNS struct {
	init *os.Process
	ctl  *os.File // to the init: one byte asks for a reset
	ack  *os.File // from the init: one byte per reset done
	fd   int      // the PID namespace
	dead chan struct{}
	pool *nsPool // once listed in it
	once sync.Once
}

// nsPool holds the free namespaces of one spawner.
type nsPool struct {
	mu     sync.Mutex
	free   []*pidNS
	all    map[*pidNS]bool // every namespace not yet closed, free or in use
	closed bool
}

// get returns a free namespace, else the namespace of a free tree of
// another view, else starts one (from the inits' thread, its parent,
// whose death kills it).
func (p *nsPool) get(sp *spawner) (*pidNS, error) {
	for {
		p.mu.Lock()
		if len(p.free) == 0 {
			p.mu.Unlock()
			break
		}
		ns := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.mu.Unlock()
		select {
		case <-ns.dead:
			ns.close()
			continue
		default:
		}
		return ns, nil
	}
	// None free: the namespace of another view's free tree (tree.go).
	if ns := sp.stealNS(); ns != nil {
		return ns, nil
	}
	var ns *pidNS
	err := errClosed
	sp.runOn(sp.initReq, func() { ns, err = startNS(sp) })
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	closed := p.closed
	if !closed {
		if p.all == nil {
			p.all = map[*pidNS]bool{}
		}
		p.all[ns] = true
		ns.pool = p
	}
	p.mu.Unlock()
	if closed {
		ns.close()
		return nil, errClosed
	}
	return ns, nil
}

// forget drops a closed namespace from the pool's list.
func (p *nsPool) forget(ns *pidNS) {
	p.mu.Lock()
	delete(p.all, ns)
	p.mu.Unlock()
}

// killAll kills the init of every namespace still alive, those of running
// calls included: their calls end (the kernel kills a PID namespace's
// processes with its init), and their watchers with them.
func (p *nsPool) killAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for ns := range p.all {
		ns.init.Kill()
	}
}

// put returns a reset namespace to the pool (or closes it when the pool
// is closed).
func (p *nsPool) put(ns *pidNS) {
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.free = append(p.free, ns)
	}
	p.mu.Unlock()
	if closed {
		ns.close()
	}
}

// close ends every free namespace; those in use end when their call does.
func (p *nsPool) close() {
	p.mu.Lock()
	p.closed = true
	free := p.free
	p.free = nil
	p.mu.Unlock()
	for _, ns := range free {
		ns.close()
	}
}

func startNS(sp *spawner) (*pidNS, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	cmd := exec.Command(exe, nsInitArg)
	cmd.Env = []string{initEnv + "=1"}
	cmd.ExtraFiles = []*os.File{ctlR, ackW} // fds 3 and 4
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWPID}
	err = cmd.Start()
	ctlR.Close()
	ackW.Close()
	if err != nil {
		ctlW.Close()
		ackR.Close()
		return nil, fmt.Errorf("start the namespace's init: %w", err)
	}
	ns := &pidNS{init: cmd.Process, ctl: ctlW, ack: ackR, fd: -1, dead: make(chan struct{})}
	sp.wg.Add(1)
	go func() {
		defer sp.wg.Done()
		cmd.Wait()
		close(ns.dead)
	}()
	if !ns.answered() {
		ns.close()
		return nil, errors.New("the namespace's init did not start")
	}
	if ns.fd, err = unix.Openat(sp.hostProc, fmt.Sprintf("%d/ns/pid", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		ns.close()
		return nil, fmt.Errorf("open the namespace: %w", err)
	}
	return ns, nil
}

// answered reads one byte from the init, within resetTimeout.
func (ns *pidNS) answered() bool {
	ns.ack.SetReadDeadline(time.Now().Add(resetTimeout))
	var b [1]byte
	n, _ := ns.ack.Read(b[:])
	return n == 1
}

// reset has the init kill every other process of the namespace; false
// (and the namespace closed) when it does not answer.
func (ns *pidNS) reset() bool {
	if _, err := ns.ctl.Write([]byte{'r'}); err == nil && ns.answered() {
		return true
	}
	ns.close()
	return false
}

// close kills the init, and so every process of the namespace. Called
// by whoever holds the namespace (the pool, or the call using it), once.
func (ns *pidNS) close() {
	ns.once.Do(func() {
		ns.init.Kill()
		ns.ctl.Close()
		ns.ack.Close()
		if ns.fd >= 0 {
			unix.Close(ns.fd)
			ns.fd = -1
		}
		if ns.pool != nil {
			ns.pool.forget(ns)
		}
	})
}

// runNSInit is PID 1 of a pooled PID namespace. It closes its /proc
// entries to the calls (not dumpable), reaps whatever reparents to it,
// and for each byte from the runner (fd 3) kills every other process of
// the namespace, reaps what it can and answers one byte (fd 4). On EOF it
// exits, and the kernel kills what is left of the namespace.
func runNSInit() int {
	if os.Getpid() != 1 {
		// Only ever the init of its own namespace: kill(-1) anywhere
		// else would reach every process of the user.
		fmt.Fprintln(os.Stderr, "floe sandbox: the namespace init must be PID 1")
		return 127
	}
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	_ = os.Chdir("/")
	unix.CloseOnExec(3)
	unix.CloseOnExec(4)
	ctl, ack := os.NewFile(3, "ctl"), os.NewFile(4, "ack")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	reap := func() {
		for {
			if p, err := unix.Wait4(-1, nil, unix.WNOHANG, nil); p <= 0 && !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}
	go func() {
		for range sigs {
			reap()
		}
	}()
	if _, err := ack.Write([]byte{'.'}); err != nil {
		return 1
	}
	b := make([]byte, 1)
	for {
		if n, err := ctl.Read(b); n == 0 || err != nil {
			return 0
		}
		// kill(-1) reaches every process of the namespace but this one,
		// and a process being forked as it runs is refused (the parent has
		// a fatal signal pending): nothing of the call survives it.
		_ = unix.Kill(-1, unix.SIGKILL)
		reap()
		if _, err := ack.Write(b); err != nil {
			return 1
		}
	}
}
