package sandbox

import (
	"bytes"
	"io"

	"golang.org/x/sys/unix"
)

// A kept call tree (tree.go) keeps its last call's IPC namespace too, for
// the next call, when that call left no IPC object in it. A new IPC
// namespace per call cost the runner its creation (an mqueue filesystem
// is mounted for each) and the kernel its teardown after the call (a
// worker frees it behind an RCU grace period): by perf about 40 and
// 100 µs per call, a third of what confining a `true` cost. An IPC
// namespace holds nothing but its objects — System V message queues,
// semaphore sets and shared memory segments, and POSIX message queues —
// and its sysctls, which a call cannot change (its /proc is read-only,
// and it holds no capability). So once the call's command has exited as
// the call's last process (a call that left others gets a new namespace:
// a process killed in the middle of a system call may still finish it),
// the namespace is as good as new when it holds no object:
// /proc/sysvipc/{msg,sem,shm}, opened in the namespace, list none (they
// list every object of it, whatever its permissions), and its mqueue
// filesystem (mounted, detached, when the namespace was made) has no
// entry. Otherwise the next call gets a new one. What a later call can
// still tell is how many objects earlier calls of the tree made (object
// ids grow), as pids tell how many processes ran before it in its PID
// namespace.

// ipcNS is a tree's IPC namespace and the handles that check it is empty.
type ipcNS struct {
	fd    int    // the namespace
	sysv  [3]int // /proc/sysvipc/{msg,sem,shm} opened in it
	mq    int    // the root of its mqueue filesystem
	empty bool   // its last call left no object (set after the call)
	buf   []byte
}

// noIPC is a tree's ipcNS before its first call.
var noIPC = ipcNS{fd: -1, sysv: [3]int{-1, -1, -1}, mq: -1}

// enter puts the calling spawner thread in the namespace for the next
// call: the kept one when its last call left it empty, else a new one
// (and the old one released). proc is a handle on the host's /proc.
func (n *ipcNS) enter(proc int) error {
	if n.fd >= 0 && n.empty {
		n.empty = false // until the call has been checked
		return unix.Setns(n.fd, unix.CLONE_NEWIPC)
	}
	n.close()
	*n = noIPC
	if err := unix.Unshare(unix.CLONE_NEWIPC); err != nil {
		return err
	}
	// Without every handle the namespace is not kept (n.fd stays -1): the
	// next call gets a new one.
	fd, err := unix.Openat(proc, "thread-self/ns/ipc", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	h := ipcNS{fd: fd, sysv: [3]int{-1, -1, -1}, mq: -1}
	defer func() {
		if h.fd >= 0 {
			h.close()
		}
	}()
	for i, name := range []string{"sysvipc/msg", "sysvipc/sem", "sysvipc/shm"} {
		if h.sysv[i], err = unix.Openat(proc, name, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return nil
		}
	}
	if h.mq, err = openMqueue(); err != nil {
		return nil
	}
	*n, h.fd = h, -1
	return nil
}

// openMqueue opens the root of the calling thread's IPC namespace's
// mqueue filesystem, on a detached mount of it.
func openMqueue() (int, error) {
	fs, err := unix.Fsopen("mqueue", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, err
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, err
	}
	defer unix.Close(m)
	return unix.Openat(m, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// isEmpty says whether the namespace holds no IPC object (false when it
// cannot tell, or is not kept). Called once every process of its call is
// gone.
func (n *ipcNS) isEmpty() bool {
	if n.fd < 0 {
		return false
	}
	if n.buf == nil {
		n.buf = make([]byte, 4096)
	}
	for _, fd := range n.sysv {
		// The header line alone.
		c, err := unix.Pread(fd, n.buf, 0)
		if err != nil || c <= 0 || bytes.IndexByte(n.buf[:c], '\n') != c-1 {
			return false
		}
	}
	if _, err := unix.Seek(n.mq, 0, io.SeekStart); err != nil {
		return false
	}
	return eachDirent(n.mq, n.buf, func(name []byte) bool {
		return string(name) == "." || string(name) == ".."
	})
}

// close releases the handles (the namespace ends with its last process).
func (n *ipcNS) close() {
	for _, fd := range append([]int{n.fd, n.mq}, n.sysv[:]...) {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	n.fd, n.mq, n.sysv, n.empty = -1, -1, [3]int{-1, -1, -1}, false
}
