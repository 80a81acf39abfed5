package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The direct start: the landlock backend, when the toolrunner may mount
// (it runs as root, as in CI and in most containers), starts a call's
// command itself, from a spawner thread, with no helper per call. The
// helper's start (a re-exec of this binary: 5–15 ms for a big binary's
// runtime and package inits) and its per-call Landlock layer (which
// copies the 65k port rules of the network layer below it, about 30 ms)
// were 90 % of a confined call's cost; what is left is what the call
// needs: a mount and an IPC namespace, a PID namespace, and the exec of
// its command.
//
// PID namespaces are pooled. Each has a small init (this binary
// re-executed once, runNSInit) as PID 1 that reaps what reparents to it
// and, when told, kills every other process of its namespace. A call takes
// one from the pool (starting one if none is free), and the spawner forks
// the command into it (setns of the thread's pid_ns_for_children), so the
// command is the runner's own child (its exact exit status and signal) and
// not a namespace init (which would ignore the signals it does not
// handle: `kill $$` would do nothing). When the command exits, is killed
// (timeout, abort, a limit), the init kills the rest of the call (daemons
// included) and the namespace goes back to the pool. The init has a
// thread of the spawner as parent with a parent-death signal: a kill -9 of
// the toolrunner (or Close) kills it, and with it every process of its
// namespace.
//
// Everything else happens on a spawner thread (spawner.go: a few, so
// that concurrent calls start in parallel), which holds the network
// confinement once for all calls (the Landlock port rules, or an empty
// network namespace) and is unshared from the process's filesystem
// context (CLONE_FS) so that its root, working directory and namespaces
// are its own. A call's file tree is built once per view (its Workspace
// and read paths: a Session's calls share it) and held as a mount
// namespace: a copy of the host's mount namespace, every mount made
// private, the tree built on a small tmpfs — the system directories bound
// read-only, a minimal /dev, the Workspace read-write, the hidden
// credentials files masked with /dev/null — pivoted into and the host's
// tree detached (nothing else exists for the call). A call runs in a
// copy of that view, its tree (tree.go): a mount namespace of its own
// with a tmpfs /tmp and a procfs of the call's PID namespace (the pidns=
// mount option, Linux 6.15), kept after the call, paired with that PID
// namespace, for the next call of the view, which gets a fresh /tmp (or
// the last call's, when that call left it untouched: tree.go). Per
// call the thread enters a kept tree (a new one is built only when none
// is free) and its IPC namespace (the last call's when that left no IPC
// object, else a new one: ipc.go), forks the command, and returns to the
// host's namespaces. A Workspace that lies in the host's /tmp is held by
// the view under its /proc and bound again into each call's /tmp. The
// view's build and its detach (an RCU grace period, 3 ms under load)
// happen once per view, not per call (a view whose directories were
// replaced since is rebuilt); and when the command left nothing behind
// the init is not even asked to kill.
//
// The spawner threads have an empty capability bounding set, SECBIT_NOROOT
// and no_new_privs: the command, everything it starts, and the inits run
// with no capability even as uid 0, so no mount, pivot, chroot, module or
// raw socket undoes the confinement; the inits are not dumpable, so their
// /proc entries (root, fds) are closed to the call.

// directThread prepares a spawner thread for direct starts (called on
// it, locked): its own filesystem context and no capability to pass on;
// the first also opens the handles on the host's namespaces and /proc and
// makes the staging directory the views' roots are built on (each in its
// own mount namespace, so the threads share it).
func (sp *spawner) directThread(first bool) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare the filesystem context: %w", err)
	}
	if first {
		var err error
		if sp.hostMnt, err = unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("open the host's mount namespace: %w", err)
		}
		if sp.hostIpc, err = unix.Open("/proc/thread-self/ns/ipc", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("open the host's IPC namespace: %w", err)
		}
		if sp.hostPid, err = unix.Open("/proc/thread-self/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("open the host's PID namespace: %w", err)
		}
		if sp.hostProc, err = unix.Open("/proc", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("open /proc: %w", err)
		}
		if sp.stage, err = os.MkdirTemp("", "floe-sandbox-root-"); err != nil {
			return fmt.Errorf("staging directory: %w", err)
		}
	}
	return dropPrivileges()
}

// closeDirect releases the views, the free PID namespaces and the
// handles, once the threads have ended.
func (sp *spawner) closeDirect() {
	var free []*tree
	sp.mu.Lock()
	for _, v := range sp.views {
		free = append(free, sp.dropView(v)...)
	}
	sp.mu.Unlock()
	for _, t := range free {
		t.dismantle().close()
	}
	sp.pool.close()
	for _, fd := range []int{sp.hostMnt, sp.hostIpc, sp.hostPid, sp.hostProc} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	if sp.stage != "" {
		os.Remove(sp.stage)
	}
}

// view is the file tree of the calls in one Workspace with the same read
// paths, built once (buildView) and held as a mount namespace whose root
// is that tree: each call copies it (a new mount namespace of a few dozen
// mounts, no path lookup) and adds its own /tmp and /proc. key names what
// it was built for, and ident the directories it bound, checked again at
// each call (a view whose directories were replaced since is rebuilt).
// held are the paths under /tmp (a Workspace in the host's /tmp, a hook's
// program): the view binds them under its /proc, out of sight, and each
// call binds them again in its own /tmp, which would hide them.
type view struct {
	key, ident string
	mnt        int
	held       []heldPath
	refs       int     // calls entering it (under spawner.mu)
	used       uint64  // spawner.viewClock when last taken
	gone       bool    // dropped: closed by its last user
	free       []*tree // its calls' trees kept for the next (tree.go)
}

// heldPath is a path of the call's /tmp, bound in each call from
// holdDir/<index>.
type heldPath struct {
	path    string
	dir, ro bool
}

// holdDir is where a view keeps the paths its calls bind into their /tmp:
// under /proc, which each call mounts over.
const holdDir = "/proc/.floe-hold"

// viewsMax bounds how many views a spawner keeps (the least recently used
// goes).
const viewsMax = 32

// viewKey names the file tree of a call: its Workspace and read paths.
func viewKey(ws string, read []string) string {
	return ws + "\x00" + strings.Join(read, "\x00")
}

// viewIdent identifies the directories a view binds and the files it
// masks (device and inode of each): a view whose directories were
// replaced since is stale, and so is one whose hidden credentials file was
// replaced (a rotation by rename, a Kubernetes secret's link swap), whose
// mask covers the old file only.
func viewIdent(ws string, read, hide []string) string {
	var b strings.Builder
	for _, p := range append(append([]string{ws}, read...), hide...) {
		var st unix.Stat_t
		if p != "" && unix.Stat(p, &st) == nil {
			fmt.Fprintf(&b, "%d:%d;", st.Dev, st.Ino)
		} else {
			b.WriteString("-;")
		}
	}
	return b.String()
}

// takeView returns the view of (ws, read), built now if there is none or
// it is stale; the caller gives it back with putView. On a spawner thread.
func (sp *spawner) takeView(s *Sandbox, ws string, read []string) (*view, error) {
	key, ident := viewKey(ws, read), viewIdent(ws, read, s.cfg.Hide)
	sp.mu.Lock()
	if v := sp.views[key]; v != nil && v.ident == ident {
		v.refs++
		sp.viewClock++
		v.used = sp.viewClock
		sp.mu.Unlock()
		return v, nil
	}
	sp.mu.Unlock()
	v, err := sp.buildView(s, key, ident, ws, read)
	if err != nil {
		return nil, err
	}
	var free []*tree
	sp.mu.Lock()
	if old := sp.views[key]; old != nil {
		free = sp.dropView(old) // stale, or built meanwhile by another thread
	}
	for len(sp.views) >= viewsMax {
		var lru *view
		for _, o := range sp.views {
			if lru == nil || o.used < lru.used {
				lru = o
			}
		}
		free = append(free, sp.dropView(lru)...)
	}
	sp.views[key] = v
	v.refs++
	sp.viewClock++
	v.used = sp.viewClock
	sp.mu.Unlock()
	// The dropped views' trees are dismantled; their PID namespaces serve
	// again.
	for _, t := range free {
		sp.pool.put(t.dismantle())
	}
	return v, nil
}

// putView gives back a view taken with takeView.
func (sp *spawner) putView(v *view) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	v.refs--
	if v.gone && v.refs == 0 {
		unix.Close(v.mnt)
	}
}

// dropView forgets a view; it is closed once no call is entering it. It
// returns the view's free trees, for the caller to dismantle once it has
// released sp.mu (the trees of its running calls are dismantled when
// they end). Under sp.mu.
func (sp *spawner) dropView(v *view) []*tree {
	if sp.views[v.key] == v {
		delete(sp.views, v.key)
	}
	v.gone = true
	if v.refs == 0 {
		unix.Close(v.mnt)
	}
	free := v.free
	v.free = nil
	return free
}

// buildView copies the host's mount namespace, builds the view's tree in
// it (buildTree), and holds it; on a spawner thread, which it returns to
// the host's namespaces.
func (sp *spawner) buildView(s *Sandbox, key, ident, ws string, read []string) (v *view, err error) {
	defer func() {
		if e := sp.home(); e != nil && err == nil {
			err = e
		}
		if err != nil && v != nil {
			if v.mnt >= 0 {
				unix.Close(v.mnt)
			}
			v = nil
		}
	}()
	if err := unix.Setns(sp.hostMnt, unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("sandbox: enter the host's mounts: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("sandbox: mount namespace: %w", err)
	}
	v = &view{key: key, ident: ident, mnt: -1}
	if err := v.buildTree(s, sp.stage, ws, read); err != nil {
		return v, fmt.Errorf("sandbox: the call's file tree: %w", err)
	}
	if v.mnt, err = unix.Openat(sp.hostProc, "thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return v, err
	}
	return v, nil
}

// home returns the spawner thread to the host's namespaces (and root).
func (sp *spawner) home() error {
	for _, back := range []struct{ fd, ns int }{{sp.hostMnt, unix.CLONE_NEWNS}, {sp.hostIpc, unix.CLONE_NEWIPC}, {sp.hostPid, unix.CLONE_NEWPID}} {
		if err := unix.Setns(back.fd, back.ns); err != nil {
			return fmt.Errorf("sandbox: back to the host's namespaces: %w", err)
		}
	}
	return nil
}

// startDirect starts p's command as described above; it runs on a
// spawner thread: it enters a tree of the call's view (tree.go: a copy of
// the view with a fresh /tmp and the /proc of its PID namespace) and an
// empty IPC namespace (ipc.go), and forks the command into the tree's PID
// namespace.
func (p *Proc) startDirect() (err error) {
	sp, cmd := p.sb.sp, p.Cmd
	v, err := sp.takeView(p.sb, p.ws, p.read)
	if err != nil {
		return err
	}
	defer sp.putView(v)
	t, err := sp.takeTree(p.sb, v)
	if err != nil {
		if e := sp.home(); e != nil {
			return e
		}
		return err
	}
	ran := false // a process of the call ran in the tree
	defer func() {
		if e := sp.home(); e != nil && err == nil {
			err = e
		}
		if err != nil && t != nil {
			if ran {
				t.dismantle().close()
			} else {
				// Nothing ran in it: it is as fresh as it was.
				sp.mu.Lock()
				if !v.gone {
					v.free = append(v.free, t)
					t = nil
				}
				sp.mu.Unlock()
				if t != nil {
					sp.pool.put(t.dismantle())
				}
			}
		}
	}()
	if err := unix.Setns(t.mnt, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("sandbox: enter the call's tree: %w", err)
	}
	if err := t.ipc.enter(sp.hostProc); err != nil {
		return fmt.Errorf("sandbox: IPC namespace: %w", err)
	}
	env := callEnv(cmd.Env)
	path, err := lookPath(p.spec.Argv[0], env)
	if err != nil {
		return err
	}
	cmd.Path, cmd.Args, cmd.Env, cmd.Err = path, p.spec.Argv, env, nil
	cmd.Dir = p.spec.Dir
	cmd.ExtraFiles = nil
	var flags uintptr
	if p.sb.cfg.NetworkOff && !sp.netns {
		flags |= syscall.CLONE_NEWNET
	}
	// No Pdeathsig: its check would misread the parent (outside the
	// namespace) as dead; the init's takes the call down with the runner.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: flags}
	if err := unix.Setns(t.ns.fd, unix.CLONE_NEWPID); err != nil {
		return fmt.Errorf("sandbox: enter the PID namespace: %w", err)
	}
	if err := cmd.Start(); err != nil {
		// The child ran nothing of the call (its exec failed).
		return err
	}
	ran = true
	// The call's now: its process holds its namespaces.
	pidfd, e := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK)
	if e != nil {
		// Unreachable while the child is not reaped; fail closed.
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("sandbox: pidfd: %w", e)
	}
	p.endCall(t, pidfd)
	t = nil
	return nil
}

// readAt reads a small file relative to dir.
func readAt(dir int, name string) ([]byte, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	b := make([]byte, 4096)
	n, err := unix.Read(fd, b)
	if err != nil {
		return nil, err
	}
	return b[:n], nil
}

// endCall watches the call: its limits until it ends, and its command's
// exit, upon which the namespace's init kills the rest of the call (when
// anything is left: the namespace's /proc shows more than its init and
// the command), and then, once the call's outcome is out, its tree gets a
// fresh /tmp and goes back to its view (recycle).
func (p *Proc) endCall(t *tree, pidfd int) {
	p.watchLimits(t.proc)
	p.exited = make(chan struct{})
	p.ended = make(chan struct{})
	sp := p.sb.sp
	// The pidfd (non-blocking) goes to the runtime's poller: the goroutine
	// waiting for the exit parks without holding an OS thread in a
	// blocking poll(2).
	exited := os.NewFile(uintptr(pidfd), "pidfd")
	sp.wg.Add(1)
	go func() {
		defer sp.wg.Done()
		waitExit(exited)
		close(p.exited)
		p.limit = p.limits.end()
		alone := p.limits.alone(func() int { return nsPid(sp.hostProc, pidfd) })
		exited.Close()
		clean := alone || t.ns.reset()
		close(p.ended)
		if !clean {
			t.dismantle() // its namespace closed by reset
			return
		}
		sp.recycle(p.sb, t, alone)
	}()
}

// waitExit returns once the process of the pidfd f has exited (the
// pidfd reads as ready), parked in the runtime's poller meanwhile; where f
// is not pollable, in a blocking poll(2).
func waitExit(f *os.File) {
	if rc, err := f.SyscallConn(); err == nil {
		if rc.Read(func(fd uintptr) bool { return exitedFD(fd, 0) }) == nil {
			return
		}
	}
	for !exitedFD(f.Fd(), -1) {
	}
}

// exitedFD polls a pidfd for the process's exit, for up to timeout ms
// (-1: no limit).
func exitedFD(fd uintptr, timeout int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, timeout)
	return n > 0 || (err != nil && !errors.Is(err, unix.EINTR))
}

// callEnv is the command's environment: TMPDIR is the private /tmp, and a
// HOME the call cannot see (the service's) is that /tmp too. Called in the
// call's view.
func callEnv(in []string) []string {
	env := make([]string, 0, len(in)+2)
	home := false
	for _, kv := range in {
		switch {
		case strings.HasPrefix(kv, initEnv+"="), strings.HasPrefix(kv, "TMPDIR="):
			continue
		case strings.HasPrefix(kv, "HOME="):
			if fi, err := os.Stat(kv[len("HOME="):]); err != nil || !fi.IsDir() {
				kv = "HOME=/tmp"
			}
			home = true
		}
		env = append(env, kv)
	}
	if !home {
		env = append(env, "HOME=/tmp")
	}
	return append(env, "TMPDIR=/tmp")
}

// lookPath finds name on env's PATH, in the call's view.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		f := filepath.Join(dir, name)
		if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", fmt.Errorf("sandbox: %s: executable file not found in $PATH", name)
}

// devices are the /dev nodes a call gets (read-write).
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// devLinks are the usual links of a minimal /dev into /proc.
var devLinks = map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}

// buildTree builds a view's file tree on a tmpfs mounted on the staging
// directory and pivots the thread into it: everything of a call's tree
// but its /tmp and /proc (callMounts), with what the call binds into its
// /tmp held under holdDir.
func (v *view) buildTree(s *Sandbox, stage, ws string, read []string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	at := func(path string) string { return stage + path }
	bind := func(src, dst string, ro bool) error {
		if err := unix.Mount(src, at(dst), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", dst, err)
		}
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID}
		if ro {
			attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(unix.AT_FDCWD, at(dst), unix.AT_RECURSIVE, &attr); err != nil {
			return fmt.Errorf("protect %s: %w", dst, err)
		}
		return nil
	}
	// mountpoint makes path in the tree (a directory, or an empty file for
	// a file), its parents as directories.
	mountpoint := func(path string, dir bool) error {
		if err := os.MkdirAll(filepath.Dir(at(path)), 0o755); err != nil {
			return err
		}
		if dir {
			if err := os.Mkdir(at(path), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
			return nil
		}
		f, err := os.OpenFile(at(path), os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}
	// The system and the extra read-only paths, parents first so that a
	// path inside a bound directory lands on top of it.
	ro := append(append(slices.Clone(SystemDirs), s.cfg.Read...), read...)
	slices.SortStableFunc(ro, func(a, b string) int { return len(a) - len(b) })
	var bound, underTmp []string
	// hold binds src at holdDir/<n>, for each call to bind into its /tmp.
	hold := func(src string, ro bool) error {
		fi, err := os.Stat(src)
		if err != nil {
			return nil
		}
		h := heldPath{path: src, dir: fi.IsDir(), ro: ro}
		at := fmt.Sprintf("%s/%d", holdDir, len(v.held))
		if err := mountpoint(at, h.dir); err != nil {
			return err
		}
		if err := bind(src, at, ro); err != nil {
			return err
		}
		v.held = append(v.held, h)
		return nil
	}
	for _, d := range ro {
		d = filepath.Clean(d)
		if !filepath.IsAbs(d) || slices.Contains(bound, d) {
			continue
		}
		if underHostTmp(d) {
			// Bound once the call's own /tmp is mounted (a hook's
			// program kept in the host's /tmp), else it would hide them.
			underTmp = append(underTmp, d)
			continue
		}
		fi, err := os.Lstat(d)
		if err == nil && fi.Mode()&os.ModeSymlink != 0 && !slices.Contains(SystemDirs, d) {
			// An extra path that is a link: its target, at the path.
			fi, err = os.Stat(d)
		}
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			t, err := os.Readlink(d)
			if err != nil {
				continue
			}
			if err := os.MkdirAll(filepath.Dir(at(d)), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(t, at(d)); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		default:
			if err := mountpoint(d, fi.IsDir()); err != nil {
				return err
			}
			if err := bind(d, d, true); err != nil {
				return err
			}
			bound = append(bound, d)
		}
	}
	// /dev: the harmless nodes, and the usual links into /proc.
	if err := os.Mkdir(at("/dev"), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	for _, d := range devices {
		if _, err := os.Stat("/dev/" + d); err != nil {
			continue
		}
		if err := mountpoint("/dev/"+d, false); err != nil {
			return err
		}
		if err := bindRO("/dev/"+d, at("/dev/"+d)); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", d, err)
		}
	}
	for name, target := range devLinks {
		if err := os.Symlink(target, at("/dev/"+name)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	// /proc and /tmp are the call's (callMounts); what it binds into its
	// /tmp (the Workspace first, which may lie there) is held meanwhile.
	for _, d := range []string{"/proc", "/tmp"} {
		if err := mountpoint(d, true); err != nil {
			return err
		}
	}
	if ws != "" {
		if underHostTmp(ws) {
			if err := hold(ws, false); err != nil {
				return err
			}
		} else {
			if err := mountpoint(ws, true); err != nil {
				return err
			}
			if err := bind(ws, ws, false); err != nil {
				return err
			}
		}
	}
	for _, d := range underTmp {
		if err := hold(d, true); err != nil {
			return err
		}
	}
	if inUserNS() {
		// In a user namespace (a rootless container, or a runner not
		// started as root) the kernel mounts a new procfs only where one
		// is fully visible in the mount namespace already: the runner's
		// own, held too, covered by each call's /proc like the rest.
		if err := mountpoint(holdDir+"/proc", true); err != nil {
			return err
		}
		if err := unix.Mount("/proc", at(holdDir+"/proc"), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("hold /proc: %w", err)
		}
	}
	for _, f := range s.cfg.Hide {
		if !slices.ContainsFunc(bound, func(d string) bool { return f == d || strings.HasPrefix(f, d+"/") }) {
			continue
		}
		if _, err := os.Stat(at(f)); err == nil {
			if err := bindRO("/dev/null", at(f)); err != nil {
				return fmt.Errorf("hide %s: %w", f, err)
			}
		}
	}
	// The tree's own directories are read-only: a call writes only its
	// Workspace and /tmp.
	if err := unix.MountSetattr(unix.AT_FDCWD, stage, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("read-only root: %w", err)
	}
	if err := unix.Chdir(stage); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's tree: %w", err)
	}
	// Private, so that a call's own mounts in its copy of the view never
	// reach the view or another call.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the view private: %w", err)
	}
	return unix.Chdir("/")
}

// inUserNS says whether this process runs in a user namespace other than
// the initial one (its uid map is not the whole range onto itself).
var inUserNS = sync.OnceValue(func() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) != 3 || f[0] != "0" || f[1] != "0" || f[2] != "4294967295"
})

// underHostTmp says whether path is the host's /tmp or lies in it: a call
// has its own /tmp there.
func underHostTmp(path string) bool {
	return path == "/tmp" || strings.HasPrefix(path, "/tmp/")
}

// mountProc mounts a procfs of ns's PID namespace on dir and returns a
// handle on it, through which the runner watches the tree's calls.
func mountProc(ns *pidNS, dir string) (int, error) {
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen proc: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetFd(fs, "pidns", ns.fd); err != nil {
		return -1, fmt.Errorf("proc pidns= (needs Linux 6.15): %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create proc: %w", err)
	}
	// Read-only: uid 0 may write most of /proc/sys and /proc/sysrq-trigger
	// by file mode alone, without a capability.
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsmount proc: %w", err)
	}
	defer unix.Close(m)
	if err := unix.MoveMount(m, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return -1, fmt.Errorf("move_mount proc: %w", err)
	}
	// The handle is a directory opened on the mount (fsmount's is a path
	// only), which the watcher reads again and again.
	d, err := unix.Openat(m, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the call's /proc: %w", err)
	}
	return d, nil
}

// limits watches a directly started call's processes through its /proc
// (a handle on the procfs of its PID namespace) and kills its PID 1 when
// one of the limits is exceeded.
type limits struct {
	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once
	limit   string // set before stopped is closed
	w       *watcher
}

// alone says whether nothing but the namespace's init and the call's
// command is left in the call's /proc (false when unsure), once the
// command has exited. The command is usually reaped by then (Run waits
// for it as soon as it exits); only when one process is left is the
// command's pid in its namespace read (nsPid, from its pidfd, while it
// is not reaped) to tell the command from anything it left behind.
func (l *limits) alone(nsPid func() int) bool {
	left, n := 0, 0
	count := func() bool {
		n = 0
		return l.w.each(func(pid int, _ []byte) { n, left = n+1, pid })
	}
	if !count() {
		return false
	}
	switch {
	case n == 0:
		return true
	case n > 1:
		return false
	}
	switch pid := nsPid(); {
	case pid == left:
		return true
	case pid < 0:
		// Reaped meanwhile (or unreadable): what is left now is all.
		return count() && n == 0
	}
	return false
}

// nsPid is the pid, in its PID namespace, of the process of pidfd (from
// the pidfd's fdinfo: much cheaper to read than its status); -1 when it
// has been reaped or cannot be read. proc is a handle on the host's /proc.
func nsPid(proc, pidfd int) int {
	b, err := readAt(proc, fmt.Sprintf("thread-self/fdinfo/%d", pidfd))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" {
			if n, err := strconv.Atoi(f[len(f)-1]); err == nil && n > 0 {
				return n
			}
		}
	}
	return -1
}

// watchLimits starts the call's watcher on its /proc (fd, the tree's
// handle, which the tree keeps).
func (p *Proc) watchLimits(fd int) {
	l := &limits{stop: make(chan struct{}), stopped: make(chan struct{})}
	p.limits = l
	proc := p.Cmd.Process
	w := watcher{dir: fd, self: -1, memory: int64(p.sb.cfg.MemoryMB) << 20, pids: p.sb.cfg.Pids}
	l.w = &w
	p.sb.sp.wg.Add(1)
	go func() {
		defer p.sb.sp.wg.Done()
		defer close(l.stopped)
		tick := time.NewTicker(watchEvery)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
			if l.limit = w.check(); l.limit != "" {
				proc.Kill()
				return
			}
		}
	}()
}

// end stops the watcher and returns the limit it found, if any.
func (l *limits) end() string {
	if l == nil {
		return ""
	}
	l.once.Do(func() { close(l.stop) })
	<-l.stopped
	return l.limit
}
