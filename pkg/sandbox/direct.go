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
// command itself, from the spawner thread, with no helper per call. The
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
// included) and the namespace goes back to the pool. The init has the
// spawner thread as parent with a parent-death signal: a kill -9 of the
// toolrunner kills it, and with it every process of its namespace.
//
// Everything else happens on the spawner thread, which holds the network
// confinement once for all calls (the Landlock port rules, or an empty
// network namespace) and is unshared from the process's filesystem
// context (CLONE_FS) so that its root, working directory and namespaces
// are its own. Per call it copies the host's mount namespace (and a new
// IPC namespace), makes every mount private, builds the call's file tree
// on a small tmpfs — the system directories bound read-only, a minimal
// /dev, a procfs of the call's PID namespace (the pidns= mount option,
// Linux 6.15), a fresh tmpfs /tmp, the Workspace read-write, the hidden
// credentials files masked with /dev/null — pivots into it and detaches
// the host's tree (nothing else exists for the call), forks the command,
// and returns to the host's namespaces. That building is done ahead:
// after each call the spawner, when no call waits, builds the namespaces
// of the next call in the same view (Workspace and read paths; a Session's
// calls share them) and holds them, so the next call only enters them and
// forks (a view whose directories were replaced since is rebuilt). The
// call's mount namespace is held until its result is reported, so that
// its teardown is not part of the command's exit; and when the command
// left nothing behind the init is not even asked to kill.
//
// The spawner thread has an empty capability bounding set, SECBIT_NOROOT
// and no_new_privs: the command, everything it starts, and the inits run
// with no capability even as uid 0, so no mount, pivot, chroot, module or
// raw socket undoes the confinement; the inits are not dumpable, so their
// /proc entries (root, fds) are closed to the call.

// directThread prepares the spawner thread for direct starts (called on
// it, locked): its own filesystem context, handles on the host's mount
// namespace and /proc, a staging directory for the calls' roots, and no
// capability to pass on.
func (sp *spawner) directThread() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare the filesystem context: %w", err)
	}
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
	return dropPrivileges()
}

func (sp *spawner) closeDirect() {
	for k, pr := range sp.ready {
		pr.release(sp)
		delete(sp.ready, k)
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

// prepared is a call's namespaces built ahead (prepare): its mount and
// IPC namespaces (held by fds), the pooled PID namespace they go with, and
// the handle on its /proc. key names what it was built for, and ident the
// Workspace and read paths it bound, checked again when it is used.
type prepared struct {
	key      string
	ident    string
	mnt, ipc int
	ns       *pidNS
	procFD   int
}

// readyMax bounds how many calls' namespaces a spawner keeps built ahead.
const readyMax = 4

// viewKey names the file tree of a call: its Workspace and read paths.
func viewKey(ws string, read []string) string {
	return ws + "\x00" + strings.Join(read, "\x00")
}

// viewIdent identifies the directories a view binds (device and inode of
// each): a prepared view whose directories were replaced since is stale.
func viewIdent(ws string, read []string) string {
	var b strings.Builder
	for _, p := range append([]string{ws}, read...) {
		var st unix.Stat_t
		if p != "" && unix.Stat(p, &st) == nil {
			fmt.Fprintf(&b, "%d:%d;", st.Dev, st.Ino)
		} else {
			b.WriteString("-;")
		}
	}
	return b.String()
}

// prepare builds, on the spawner thread, the namespaces of a call in ws
// with read: it takes a PID namespace from the pool, copies the host's
// mount namespace and a new IPC namespace, builds the file tree and
// returns to the host's namespaces, holding the new ones.
func (sp *spawner) prepare(s *Sandbox, ws string, read []string) (pr *prepared, err error) {
	ident := viewIdent(ws, read)
	ns, err := sp.pool.get(sp)
	if err != nil {
		return nil, fmt.Errorf("sandbox: PID namespace: %w", err)
	}
	q := &Proc{sb: s, ws: ws, read: read, procFD: -1}
	built := &prepared{key: viewKey(ws, read), ident: ident, mnt: -1, ipc: -1, ns: ns, procFD: -1}
	defer func() {
		if e := sp.home(); e != nil && err == nil {
			err = e
		}
		if err != nil {
			built.release(sp)
			if q.procFD >= 0 {
				unix.Close(q.procFD)
			}
			pr = nil
		}
	}()
	pr = built
	if err := unix.Setns(sp.hostMnt, unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("sandbox: enter the host's mounts: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWIPC); err != nil {
		return nil, fmt.Errorf("sandbox: mount and IPC namespaces: %w", err)
	}
	if err := q.enterView(ns); err != nil {
		return nil, fmt.Errorf("sandbox: the call's file tree: %w", err)
	}
	built.procFD, q.procFD = q.procFD, -1
	if built.mnt, err = unix.Openat(sp.hostProc, "thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	if built.ipc, err = unix.Openat(sp.hostProc, "thread-self/ns/ipc", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	return built, nil
}

// release gives up an unused prepared call: its namespaces, and its PID
// namespace back to the pool (nothing ran in it).
func (pr *prepared) release(sp *spawner) {
	for _, fd := range []int{pr.mnt, pr.ipc, pr.procFD} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	pr.mnt, pr.ipc, pr.procFD = -1, -1, -1
	if pr.ns != nil && pr.ns.fd >= 0 {
		sp.pool.put(pr.ns)
	}
	pr.ns = nil
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

// take returns the prepared call for (ws, read), built ahead or now,
// and has the next one for the same view built ahead when the spawner is
// idle (consecutive calls of a Session share their Workspace).
func (sp *spawner) take(s *Sandbox, ws string, read []string) (*prepared, error) {
	key := viewKey(ws, read)
	pr := sp.ready[key]
	if pr != nil {
		delete(sp.ready, key)
		if pr.ident != viewIdent(ws, read) {
			pr.release(sp) // a directory was replaced since: stale
			pr = nil
		}
	}
	read = slices.Clone(read)
	if !sp.queued[key] {
		sp.queued[key] = true
		sp.idle = append(sp.idle, func() { sp.prepareAhead(s, key, ws, read) })
	}
	if pr != nil {
		return pr, nil
	}
	return sp.prepare(s, ws, read)
}

// prepareAhead builds the next call's namespaces for a view (idle work).
func (sp *spawner) prepareAhead(s *Sandbox, key, ws string, read []string) {
	delete(sp.queued, key)
	if _, ok := sp.ready[key]; ok {
		return
	}
	next, err := sp.prepare(s, ws, read)
	if err != nil {
		return
	}
	if len(sp.ready) >= readyMax {
		for k, old := range sp.ready { // evict one
			old.release(sp)
			delete(sp.ready, k)
			break
		}
	}
	sp.ready[key] = next
}

// startDirect starts p's command as described above; it runs on the
// spawner thread.
func (p *Proc) startDirect() (err error) {
	sp, cmd := p.sb.sp, p.Cmd
	pr, err := sp.take(p.sb, p.ws, p.read)
	if err != nil {
		return err
	}
	ns := pr.ns
	defer func() {
		if err != nil {
			pr.release(sp)
		}
		if e := sp.home(); e != nil && err == nil {
			err = e
		}
	}()
	if err := unix.Setns(pr.mnt, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("sandbox: enter the call's mounts: %w", err)
	}
	if err := unix.Setns(pr.ipc, unix.CLONE_NEWIPC); err != nil {
		return fmt.Errorf("sandbox: enter the call's IPC namespace: %w", err)
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
	if err := unix.Setns(ns.fd, unix.CLONE_NEWPID); err != nil {
		return fmt.Errorf("sandbox: enter the PID namespace: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	// The call's now: its process holds its namespaces.
	unix.Close(pr.ipc)
	mnt := pr.mnt
	p.procFD = pr.procFD
	pr.ipc, pr.mnt, pr.procFD, pr.ns = -1, -1, -1, nil
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		// Unreachable while the child is not reaped; fail closed.
		cmd.Process.Kill()
		ns.reset()
		cmd.Wait()
		unix.Close(mnt)
		return fmt.Errorf("sandbox: pidfd: %w", err)
	}
	// The command's pid in its namespace, to tell it from anything it
	// left behind; and a hold on the call's mount namespace, so that its
	// teardown happens after the call is reported, not in its exit.
	nsPid := -1
	if b, err := readAt(sp.hostProc, fmt.Sprintf("%d/status", cmd.Process.Pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" {
				nsPid, _ = strconv.Atoi(f[len(f)-1])
			}
		}
	}
	p.endCall(ns, pidfd, nsPid, mnt)
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
// the command) and the namespace goes back to the pool. mnt (a hold on
// the call's mount namespace, or -1) is released last.
func (p *Proc) endCall(ns *pidNS, pidfd, nsPid, mnt int) {
	p.watchLimits()
	p.ended = make(chan struct{})
	p.sb.sp.wg.Add(1)
	go func() {
		defer p.sb.sp.wg.Done()
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
				break
			}
		}
		unix.Close(pidfd)
		p.limit = p.limits.end()
		if p.limits.alone(nsPid) || ns.reset() {
			p.sb.sp.pool.put(ns)
		}
		p.limits.close()
		close(p.ended)
		if mnt >= 0 {
			unix.Close(mnt)
		}
	}()
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

// enterView builds the call's file tree on a tmpfs mounted on the staging
// directory and pivots the thread into it.
func (p *Proc) enterView(ns *pidNS) error {
	s, stage := p.sb, p.sb.sp.stage
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
	ro := append(append(slices.Clone(SystemDirs), s.cfg.Read...), p.read...)
	slices.SortStableFunc(ro, func(a, b string) int { return len(a) - len(b) })
	var bound, underTmp []string
	bindRO := func(d string) error {
		fi, err := os.Stat(d)
		if err != nil {
			return nil
		}
		if err := mountpoint(d, fi.IsDir()); err != nil {
			return err
		}
		if err := bind(d, d, true); err != nil {
			return err
		}
		bound = append(bound, d)
		return nil
	}
	for _, d := range ro {
		d = filepath.Clean(d)
		if !filepath.IsAbs(d) || slices.Contains(bound, d) {
			continue
		}
		if strings.HasPrefix(d, "/tmp/") {
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
		if err := unix.Mount("/dev/"+d, at("/dev/"+d), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", d, err)
		}
	}
	for name, target := range devLinks {
		if err := os.Symlink(target, at("/dev/"+name)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	if err := mountpoint("/proc", true); err != nil {
		return err
	}
	if err := p.mountProc(ns, at("/proc")); err != nil {
		return fmt.Errorf("the call's /proc: %w", err)
	}
	// The call's /tmp, then its Workspace (which may lie under /tmp: it
	// then lands inside the call's /tmp, at its own path).
	if err := mountpoint("/tmp", true); err != nil {
		return err
	}
	tmpOpts := fmt.Sprintf("mode=1777,size=%dm", max(p.sb.cfg.MemoryMB, 64))
	if err := unix.Mount("tmpfs", at("/tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpOpts); err != nil {
		return fmt.Errorf("the call's /tmp: %w", err)
	}
	if p.ws != "" {
		if err := mountpoint(p.ws, true); err != nil {
			return err
		}
		if err := bind(p.ws, p.ws, false); err != nil {
			return err
		}
	}
	for _, d := range underTmp {
		if slices.Contains(bound, d) {
			continue
		}
		if err := bindRO(d); err != nil {
			return err
		}
	}
	for _, f := range s.cfg.Hide {
		if !slices.ContainsFunc(bound, func(d string) bool { return f == d || strings.HasPrefix(f, d+"/") }) {
			continue
		}
		if _, err := os.Stat(at(f)); err == nil {
			if err := unix.Mount("/dev/null", at(f), "", unix.MS_BIND, ""); err != nil {
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
	return unix.Chdir("/")
}

// mountProc mounts a procfs of ns's PID namespace on dir and keeps a
// handle on it (p.procFD), through which the runner watches the call.
func (p *Proc) mountProc(ns *pidNS, dir string) error {
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen proc: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetFd(fs, "pidns", ns.fd); err != nil {
		return fmt.Errorf("proc pidns= (needs Linux 6.15): %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("create proc: %w", err)
	}
	// Read-only: uid 0 may write most of /proc/sys and /proc/sysrq-trigger
	// by file mode alone, without a capability.
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("fsmount proc: %w", err)
	}
	if err := unix.MoveMount(m, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		unix.Close(m)
		return fmt.Errorf("move_mount proc: %w", err)
	}
	if p.procFD >= 0 {
		unix.Close(p.procFD)
	}
	p.procFD = m
	return nil
}

// limits watches a directly started call's processes through its /proc
// (a handle on the procfs of its PID namespace) and kills its PID 1 when
// one of the limits is exceeded.
type limits struct {
	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once
	limit   string // set before stopped is closed
	fd      int    // the call's /proc, until close
	w       *watcher
}

// alone says whether nothing but the namespace's init and the call's
// command (nsPid) is left in the call's /proc (false when unsure).
func (l *limits) alone(nsPid int) bool {
	if nsPid < 2 {
		return false
	}
	d, err := os.Open(l.w.proc)
	if err != nil {
		return false
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return false
	}
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid != 1 && pid != nsPid {
			return false
		}
	}
	return true
}

// close releases the call's /proc, once the watcher has ended.
func (l *limits) close() {
	if l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
}

func (p *Proc) watchLimits() {
	l := &limits{stop: make(chan struct{}), stopped: make(chan struct{})}
	p.limits = l
	fd, proc := p.procFD, p.Cmd.Process
	p.procFD = -1
	w := watcher{self: -1, proc: fmt.Sprintf("/proc/self/fd/%d", fd),
		memory: int64(p.sb.cfg.MemoryMB) << 20, pids: p.sb.cfg.Pids}
	l.fd, l.w = fd, &w
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
