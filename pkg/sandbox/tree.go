package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A call's tree is kept for the next call of its view (direct.go): a
// mount namespace copied from the view, with a procfs of one pooled PID
// namespace on /proc, paired with that namespace for as long as it
// lives. Copying the view (a few dozen mounts), mounting a procfs, and
// tearing both down again were most of what a confined call cost the
// kernel beyond an unconfined one; a kept tree costs a call a fresh /tmp
// only. When a call ends, everything it started is killed (the PID
// namespace's init, as before) and then its /tmp is detached and a new
// one mounted (refresh, on the inits' thread, after the call's outcome is
// out), so the next call of the view finds nothing of the last: no
// process, no file in /tmp, no IPC object (its IPC namespace is kept
// too, when the call left it empty: ipc.go).
// The refresh (a hand-off to the inits' thread, entering the tree,
// unmounting and mounting: most of the runner's CPU per call left) is
// skipped when there is nothing to refresh: the call's command was the
// only process of the call left when it ended (so none is left that
// could still change anything) and the /tmp is as it was made — its
// tmpfs holds as many inodes and blocks, and its root and the
// directories made in it have the same mode, owner, links, size and
// times (atime included). Every change a call can make to a tmpfs
// creates an inode or changes a time of the directory it changes (a file
// made and removed again leaves the directory's mtime and ctime changed;
// chmod, chown, utimes and xattrs the ctime), and the kernels the direct
// start runs on (6.15+) give tmpfs fine-grained ctimes once they were
// read (multigrain timestamps, 6.13), so no change hides in a clock tick.
// Nothing else of the tree can be changed by a call: it holds no
// capability (no mount, umount or pivot), the tree's own directories and
// the system's are read-only, and /proc is read-only; what it writes in
// its Workspace is the Workspace's, shared by design.
//
// Trees hold their PID namespaces: a call of a view with no free tree
// takes a free namespace from the pool, else dismantles the free tree of
// the least recently used view (its namespace goes to the new tree), and
// only then starts a namespace, so there are no more namespaces (and
// inits) than calls running at once, as without trees.

// tree is a kept call tree: its mount namespace, its PID namespace, a
// handle on its /proc (the watcher's), and path handles on the view's
// held paths (opened before /proc covered them), which each fresh /tmp
// binds again.
type tree struct {
	v    *view
	ns   *pidNS
	mnt  int
	proc int
	held []int
	tmp  bool // a /tmp is mounted
	// The /tmp mounted last: a handle on it, the directories freshTmp
	// made in it (relative to it), and its state then (tmpState).
	tmpFD int
	dirs  []string
	fresh string
	// The IPC namespace of its last call (ipc.go), kept for the next
	// call when that call left it empty (ipcNS.isEmpty).
	ipc ipcNS
}

// takeTree returns a free tree of v ready for a call, or builds one; on a
// spawner thread, which it may leave in the tree's mount namespace (the
// caller returns it home).
func (sp *spawner) takeTree(s *Sandbox, v *view) (*tree, error) {
	for range 64 {
		sp.mu.Lock()
		var t *tree
		if n := len(v.free); n > 0 {
			t, v.free = v.free[n-1], v.free[:n-1]
		}
		sp.mu.Unlock()
		if t == nil {
			break
		}
		if ns := t.dismantleIfDead(); ns == nil {
			return t, nil
		}
	}
	ns, err := sp.pool.get(sp)
	if err != nil {
		return nil, fmt.Errorf("sandbox: PID namespace: %w", err)
	}
	t, err := sp.buildCallTree(s, v, ns)
	if err != nil {
		sp.pool.put(ns) // nothing ran in it
		return nil, err
	}
	return t, nil
}

// dismantleIfDead dismantles t when its namespace's init is gone
// (returning a non-nil closed namespace), else returns nil.
func (t *tree) dismantleIfDead() *pidNS {
	select {
	case <-t.ns.dead:
		ns := t.dismantle()
		ns.close()
		return ns
	default:
		return nil
	}
}

// stealNS dismantles the free tree of the least recently used view and
// returns its (live) namespace; nil when no view has a free tree.
func (sp *spawner) stealNS() *pidNS {
	for range 64 {
		sp.mu.Lock()
		var from *view
		for _, v := range sp.views {
			if len(v.free) > 0 && (from == nil || v.used < from.used) {
				from = v
			}
		}
		if from == nil {
			sp.mu.Unlock()
			return nil
		}
		t := from.free[0]
		from.free = from.free[1:]
		sp.mu.Unlock()
		ns := t.dismantle()
		select {
		case <-ns.dead:
			ns.close()
		default:
			return ns
		}
	}
	return nil
}

// buildCallTree copies v into a new mount namespace and mounts its /tmp
// and a procfs of ns on /proc; on a spawner thread, which it leaves in
// the tree (the caller returns it home).
func (sp *spawner) buildCallTree(s *Sandbox, v *view, ns *pidNS) (t *tree, err error) {
	sp.treesBuilt.Add(1)
	t = &tree{v: v, ns: ns, mnt: -1, proc: -1, tmpFD: -1, ipc: noIPC}
	defer func() {
		if err != nil {
			t.dismantle()
		}
	}()
	if err := unix.Setns(v.mnt, unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("sandbox: enter the call's view: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("sandbox: mount namespace: %w", err)
	}
	for i := range v.held {
		fd, err := unix.Open(fmt.Sprintf("%s/%d", holdDir, i), unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("sandbox: hold %s: %w", v.held[i].path, err)
		}
		t.held = append(t.held, fd)
	}
	if err := t.freshTmp(s); err != nil {
		return nil, fmt.Errorf("sandbox: the call's file tree: %w", err)
	}
	if t.proc, err = mountProc(ns, "/proc"); err != nil {
		return nil, fmt.Errorf("sandbox: the call's /proc: %w", err)
	}
	if t.mnt, err = unix.Openat(sp.hostProc, "thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	return t, nil
}

// freshTmp gives the tree (the calling thread is in it) a new /tmp: the
// last one, if any, detached with everything in it, and a new tmpfs
// capped at the memory limit with the view's held paths bound into it
// (and the hidden files among them masked).
func (t *tree) freshTmp(s *Sandbox) error {
	if t.tmpFD >= 0 {
		unix.Close(t.tmpFD)
		t.tmpFD, t.dirs, t.fresh = -1, nil, ""
	}
	if t.tmp {
		if err := unix.Unmount("/tmp", unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach the last call's /tmp: %w", err)
		}
		t.tmp = false
	}
	tmpOpts := fmt.Sprintf("mode=1777,size=%dm", max(s.cfg.MemoryMB, 64))
	if err := unix.Mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpOpts); err != nil {
		return fmt.Errorf("the call's /tmp: %w", err)
	}
	t.tmp = true
	var dirs []string
	for i, h := range t.v.held {
		for d := filepath.Dir(h.path); underHostTmp(d) && d != "/tmp"; d = filepath.Dir(d) {
			if !slices.Contains(dirs, d[len("/tmp/"):]) {
				dirs = append(dirs, d[len("/tmp/"):])
			}
		}
		if err := os.MkdirAll(filepath.Dir(h.path), 0o755); err != nil {
			return err
		}
		if h.dir {
			if err := os.Mkdir(h.path, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		} else if err := touch(h.path); err != nil {
			return err
		}
		m, err := unix.OpenTree(t.held[i], "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
		if err != nil {
			return fmt.Errorf("bind %s: %w", h.path, err)
		}
		err = unix.MoveMount(m, "", unix.AT_FDCWD, h.path, unix.MOVE_MOUNT_F_EMPTY_PATH)
		unix.Close(m)
		if err != nil {
			return fmt.Errorf("bind %s: %w", h.path, err)
		}
		if !h.ro {
			continue
		}
		for _, f := range s.cfg.Hide {
			if f != h.path && !strings.HasPrefix(f, h.path+"/") {
				continue
			}
			if _, err := os.Stat(f); err == nil {
				if err := bindRO("/dev/null", f); err != nil {
					return fmt.Errorf("hide %s: %w", f, err)
				}
			}
		}
	}
	fd, err := unix.Open("/tmp", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the call's /tmp: %w", err)
	}
	t.tmpFD, t.dirs = fd, dirs
	if t.fresh, err = t.tmpState(); err != nil {
		return fmt.Errorf("the call's /tmp: %w", err)
	}
	return nil
}

// tmpState describes the tree's /tmp as far as a call can change it: the
// inodes and blocks its tmpfs holds, and the inode, mode, owner, links,
// size and times of its root and of the directories freshTmp made in it.
func (t *tree) tmpState() (string, error) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(t.tmpFD, &fs); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d %d", fs.Files-fs.Ffree, fs.Blocks-fs.Bfree)
	for _, d := range append([]string{""}, t.dirs...) {
		var st unix.Stat_t
		var err error
		if d == "" {
			err = unix.Fstat(t.tmpFD, &st)
		} else {
			err = unix.Fstatat(t.tmpFD, d, &st, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, ";%d %o %d %d %d %d %d.%d %d.%d %d.%d", st.Ino, st.Mode, st.Uid, st.Gid, st.Nlink, st.Size,
			st.Atim.Sec, st.Atim.Nsec, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return b.String(), nil
}

// untouched says whether the tree's /tmp is as freshTmp made it.
func (t *tree) untouched() bool {
	if t.tmpFD < 0 {
		return false
	}
	st, err := t.tmpState()
	return err == nil && st == t.fresh
}

// recycle refreshes the /tmp of a tree whose call has ended (everything
// of it killed) and gives the tree back to its view; a tree that cannot
// be refreshed, or whose view is gone, is dismantled. alone says the
// call's command was the only process of the call left when it ended:
// then a /tmp as it was made is not refreshed, and an IPC namespace with
// no object is kept.
func (sp *spawner) recycle(s *Sandbox, t *tree, alone bool) {
	// Kept only when the command was the call's last process: a process
	// killed in the middle of a system call may still finish it.
	t.ipc.empty = alone && t.ipc.isEmpty()
	err := errClosed
	if alone && t.untouched() {
		err = nil
	} else {
		sp.runOn(sp.initReq, func() {
			if err = unix.Setns(t.mnt, unix.CLONE_NEWNS); err != nil {
				return
			}
			err = t.freshTmp(s)
			if e := unix.Setns(sp.hostMnt, unix.CLONE_NEWNS); e != nil && err == nil {
				err = e
			}
		})
	}
	if err == nil {
		sp.mu.Lock()
		if !t.v.gone {
			t.v.free = append(t.v.free, t)
			t = nil
		}
		sp.mu.Unlock()
	}
	if t != nil {
		sp.pool.put(t.dismantle())
	}
}

// dismantle releases the tree's handles (its mount namespace ends with
// the last) and returns its PID namespace, for the caller to put back or
// close.
func (t *tree) dismantle() *pidNS {
	for _, fd := range append([]int{t.mnt, t.proc, t.tmpFD}, t.held...) {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	t.mnt, t.proc, t.tmpFD, t.held = -1, -1, -1, nil
	t.ipc.close()
	return t.ns
}
