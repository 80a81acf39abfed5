package sandbox

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The confined process tree of one call is started through a helper: the
// toolrunner's own binary re-executed with initEnv=1 and one argument, the
// JSON initSpec. The helper runs inside the call's namespaces (as PID 1 of
// its PID namespace with landlock, as PID 2 under bwrap's reaper), finishes
// the confinement that needs to happen in there (mounts, Landlock), starts
// the command, reaps every process that reparents to it, enforces the
// limits, and when the command exits kills whatever is left and reports
// the outcome on the status pipe. That the helper is the same binary
// (moby's pkg/reexec does the same) means no second file to install and no
// version skew; the hook is this package's init, so every binary that can
// run tools (floe, each test binary) answers it before doing anything else.
const initEnv = "FLOE_SANDBOX_INIT"

// initSpec is what the helper is told, as JSON in argv[1].
type initSpec struct {
	Mode     Backend  `json:"mode"`
	Argv     []string `json:"argv"`
	Dir      string   `json:"dir,omitempty"`
	Tmp      string   `json:"tmp,omitempty"`  // landlock: host dir mounted on /tmp
	RO       []string `json:"ro,omitempty"`   // landlock: read-only paths
	RW       []string `json:"rw,omitempty"`   // landlock: read-write paths
	Hide     []string `json:"hide,omitempty"` // landlock: files masked with /dev/null
	NetFD    int      `json:"netFd"`          // Landlock net ruleset, -1 none
	StatusFD int      `json:"statusFd"`
	MemoryMB int      `json:"memoryMb,omitempty"`
	Pids     int      `json:"pids,omitempty"`
}

// status is the helper's report, one JSON object on the status pipe.
type status struct {
	Code   int    `json:"code"`
	Signal int    `json:"signal,omitempty"`
	Limit  string `json:"limit,omitempty"`
	Error  string `json:"error,omitempty"`
}

func init() {
	if os.Getenv(initEnv) != "1" || len(os.Args) != 2 {
		return
	}
	// syscall.Exit, not os.Exit: nothing to flush, and a race-enabled
	// binary (a test's) would otherwise sleep a second at exit.
	if os.Args[1] == nsInitArg {
		syscall.Exit(runNSInit())
	}
	syscall.Exit(runInit(os.Args[1]))
}

// runInit is the helper's main. Its exit status only matters when the
// status pipe could not be written (127: setup failed).
func runInit(arg string) int {
	var spec initSpec
	if err := json.Unmarshal([]byte(arg), &spec); err != nil || len(spec.Argv) == 0 {
		fmt.Fprintf(os.Stderr, "floe sandbox: bad helper arguments: %v\n", err)
		return 127
	}
	out := os.NewFile(uintptr(spec.StatusFD), "status")
	report := func(s status) int {
		b, _ := json.Marshal(s)
		if out != nil {
			out.Write(append(b, '\n'))
		}
		return 0
	}
	unix.CloseOnExec(spec.StatusFD)
	if spec.NetFD >= 0 {
		unix.CloseOnExec(spec.NetFD)
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "floe sandbox: %v\n", err)
		report(status{Code: 127, Error: err.Error()})
		return 127
	}
	if spec.Mode == Landlock {
		if err := mountView(spec); err != nil {
			return fail(err)
		}
	}
	if spec.Mode == Bwrap {
		if err := roDevices(); err != nil {
			return fail(err)
		}
	}
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, initEnv+"=") && !strings.HasPrefix(kv, "TMPDIR=") {
			env = append(env, kv)
		}
	}
	env = append(env, "TMPDIR=/tmp")
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "HOME=") }) {
		env = append(env, "HOME=/tmp") // not the passwd entry's: the service's home
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	pid, err := startConfined(spec, env)
	if err != nil {
		return fail(err)
	}
	procDir, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	w := watcher{dir: procDir, self: os.Getpid(), memory: int64(spec.MemoryMB) << 20, pids: spec.Pids}
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	var st status
	limit := ""
	for done := false; !done; {
		select {
		case <-sigs:
		case <-tick.C:
			if limit == "" {
				if limit = w.check(); limit != "" {
					_ = unix.Kill(-1, unix.SIGKILL)
				}
			}
		}
		for {
			var ws unix.WaitStatus
			p, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err != nil || p <= 0 {
				break
			}
			if p == pid {
				done = true
				switch {
				case ws.Signaled():
					st.Signal = int(ws.Signal())
				default:
					st.Code = ws.ExitStatus()
				}
			}
		}
	}
	// The command is gone: end the rest of its tree (daemons included)
	// now rather than when the namespace goes down with us.
	_ = unix.Kill(-1, unix.SIGKILL)
	st.Limit = limit
	return report(st)
}

// startConfined applies the Landlock layers on one locked OS thread (a
// Landlock domain binds a thread and what it forks) and forks the command
// from it. The thread stays locked for the helper's life.
func startConfined(spec initSpec, env []string) (int, error) {
	type started struct {
		pid int
		err error
	}
	ch := make(chan started, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		pid, err := func() (int, error) {
			if spec.NetFD >= 0 {
				if err := restrictSelf(spec.NetFD); err != nil {
					return 0, err
				}
			}
			if spec.Mode == Landlock {
				fd, err := fsRuleset(landlockABI(), spec.RO, spec.RW)
				if err != nil {
					return 0, err
				}
				err = restrictSelf(fd)
				unix.Close(fd)
				if err != nil {
					return 0, err
				}
			}
			// A home directory out of the call's sight (the service's) is
			// replaced by the private /tmp, so login shells and caches work.
			for i, kv := range env {
				if home, ok := strings.CutPrefix(kv, "HOME="); ok {
					if fd, err := unix.Open(home, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
						env[i] = "HOME=/tmp"
					} else {
						unix.Close(fd)
					}
				}
			}
			if err := dropPrivileges(); err != nil {
				return 0, err
			}
			path, err := exec.LookPath(spec.Argv[0])
			if err != nil {
				return 0, err
			}
			return syscall.ForkExec(path, spec.Argv, &syscall.ProcAttr{
				Dir:   spec.Dir,
				Env:   env,
				Files: []uintptr{0, 1, 2},
			})
		}()
		ch <- started{pid, err}
		select {} // keep the restricted thread out of the scheduler's pool
	}()
	s := <-ch
	return s.pid, s.err
}

// mountView makes the landlock backend's view: a private mount namespace
// where /tmp is the call's own directory, /proc shows only the call's PID
// namespace, and each hidden file reads as empty.
func mountView(spec initSpec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if spec.Tmp != "" {
		// A Workspace (or working directory) under the host's /tmp stays
		// where it is: held open across the mount, bound back on top.
		var keep []string
		var fds []int
		for _, p := range append(append(slices.Clone(spec.RO), spec.RW...), spec.Dir) {
			if p == "" || !strings.HasPrefix(p, "/tmp/") {
				continue
			}
			fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			defer unix.Close(fd)
			keep, fds = append(keep, p), append(fds, fd)
		}
		if err := unix.Mount(spec.Tmp, "/tmp", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("mount the call's /tmp: %w", err)
		}
		for i, p := range keep {
			// A kept file (a hook's program) is bound onto an empty file.
			var st unix.Stat_t
			if err := unix.Fstat(fds[i], &st); err != nil {
				return fmt.Errorf("keep %s: %w", p, err)
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				if err := os.MkdirAll(p, 0o700); err != nil {
					return fmt.Errorf("keep %s: %w", p, err)
				}
			} else if err := touch(p); err != nil {
				return fmt.Errorf("keep %s: %w", p, err)
			}
			if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", fds[i]), p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("keep %s: %w", p, err)
			}
		}
	}
	if err := readOnlyButRW(spec.RW); err != nil {
		return err
	}
	if err := minimalDev(); err != nil {
		return err
	}
	// Read-only: uid 0 may write most of /proc/sys by file mode alone.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	for _, f := range spec.Hide {
		if err := bindRO("/dev/null", f); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("hide %s: %w", f, err)
		}
	}
	return nil
}

// readOnlyButRW makes every mount of the helper's namespace read-only but
// the read-write directories (the Workspace, /tmp). Landlock governs
// opening, writing, creating and removing files, not a file's mode,
// owner, times or extended attributes, which the owner changes without a
// capability: uid 0 (a root service) owns the whole system (a
// `chmod u+s` of a host binary), any user owns its home. A read-only
// mount stops those changes. The read-write directories are bound onto
// themselves first so that they are mounts of their own, then made
// writable again (not what is mounted inside them).
func readOnlyButRW(rw []string) error {
	var dirs []string
	for _, p := range rw {
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() || strings.HasPrefix(p, "/dev/") {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", p, err)
		}
		dirs = append(dirs, p)
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("read-only mounts: %w", err)
	}
	for _, p := range dirs {
		if err := unix.MountSetattr(unix.AT_FDCWD, p, 0, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}); err != nil {
			return fmt.Errorf("read-write %s: %w", p, err)
		}
	}
	return nil
}

// roDevices makes bubblewrap's device nodes (bound read-write from the
// host's) read-only mounts (bindRO) when the helper may: bubblewrap run
// by root passes its capabilities to the helper, and a call run as uid 0
// would own the host's nodes. Unprivileged, the helper may not (EPERM),
// and the call, not their owner, cannot change them either.
func roDevices() error {
	for _, d := range devices {
		err := unix.MountSetattr(unix.AT_FDCWD, "/dev/"+d, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC})
		if err != nil && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("read-only /dev/%s: %w", d, err)
		}
	}
	return nil
}

// minimalDev replaces the host's /dev in the helper's mount namespace by
// the direct start's: a tmpfs holding only the harmless device nodes and
// the usual links into /proc. Landlock alone let a call read every device
// node the host's /dev holds, and uid 0 (a root service) opens a raw disk
// by file mode: the whole $FLOE_HOME, read around the rules.
func minimalDev() error {
	var keep []string
	var fds []int
	for _, d := range devices {
		fd, err := unix.Open("/dev/"+d, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		defer unix.Close(fd)
		keep, fds = append(keep, d), append(fds, fd)
	}
	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for i, d := range keep {
		if err := touch("/dev/" + d); err != nil {
			return fmt.Errorf("/dev/%s: %w", d, err)
		}
		if err := bindRO(fmt.Sprintf("/proc/self/fd/%d", fds[i]), "/dev/"+d); err != nil {
			return fmt.Errorf("/dev/%s: %w", d, err)
		}
	}
	for name, target := range devLinks {
		if err := os.Symlink(target, "/dev/"+name); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	return unix.Mount("", "/dev", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "")
}

// touch creates an empty file at p (and its directories) if none is there.
func touch(p string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// watchEvery is how often the helper measures the call's processes.
const watchEvery = 10 * time.Millisecond

// watcher measures every process of the call's PID namespace through its
// /proc (the namespace's own): how many there are and their private
// resident memory (statm resident - shared, so shared libraries are not
// counted once per process). It runs every watchEvery for as long as the
// call does, so a check costs no path lookup and no allocation: the
// /proc directory stays open (dir) and is read again from its first
// process entry (procPidsOffset), each statm opened relative to it.
type watcher struct {
	dir    int // the namespace's /proc, an open directory
	self   int
	memory int64 // bytes, 0 = no limit
	pids   int   // 0 = no limit
	dents  []byte
	statm  []byte
	name   [24]byte
}

// check returns "memory" or "processes" when a limit is exceeded.
func (w *watcher) check() string {
	n := 0
	var mem int64
	page := int64(os.Getpagesize())
	w.each(func(pid int, name []byte) {
		n++
		if w.memory > 0 {
			mem += w.private(name) * page
		}
	})
	switch {
	case w.pids > 0 && n > w.pids:
		return "processes"
	case w.memory > 0 && mem > w.memory:
		return "memory"
	}
	return ""
}

// each calls f with every process of the namespace (pid and its /proc
// entry's name) but its init and the watcher itself; false when /proc
// could not be read.
func (w *watcher) each(f func(pid int, name []byte)) bool {
	if w.dents == nil {
		w.dents = make([]byte, 8192)
	}
	if _, err := unix.Seek(w.dir, procPidsOffset(), io.SeekStart); err != nil {
		return false
	}
	return eachDirent(w.dir, w.dents, func(name []byte) bool {
		if pid := atoiPid(name); pid > 1 && pid != w.self {
			f(pid, name)
		}
		return true
	})
}

// eachDirent reads the directory fd from its current offset to its end
// through buf, calling f with every entry's name until f returns false;
// it reports whether it read to the end (false on an error, an entry it
// cannot parse, or f's false).
func eachDirent(fd int, buf []byte, f func(name []byte) bool) bool {
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false
		}
		if n <= 0 {
			return true
		}
		for b := buf[:n]; len(b) >= direntName; {
			// struct linux_dirent64: ino u64, off s64, reclen u16,
			// type u8, name NUL-terminated.
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < direntName || reclen > len(b) {
				return false
			}
			name := b[direntName:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if !f(name) {
				return false
			}
			b = b[reclen:]
		}
	}
}

// direntName is the offset of the name in a linux_dirent64.
const direntName = 19

// atoiPid parses a /proc entry's name as a pid: 0 when it is none.
func atoiPid(b []byte) int {
	if len(b) == 0 || len(b) > 10 {
		return 0
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// procPidsOffset is where a readdir of a procfs root starts to list
// processes: procfs lists its fixed entries (about 60: cpuinfo, sys, …)
// at positions below 256 (FIRST_PROCESS_ENTRY), then "self",
// "thread-self" and the processes, so a watcher that seeks there skips
// the fixed entries, the larger part of each readdir. Checked once on
// this host's /proc: 0 (the whole listing) unless the seek lands on
// "self" and the listing from there shows this process.
var procPidsOffset = sync.OnceValue(func() int64 {
	const first = 256
	fd, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	if _, err := unix.Seek(fd, first, io.SeekStart); err != nil {
		return 0
	}
	buf := make([]byte, 1<<16)
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return 0
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	if len(names) == 0 || names[0] != "self" || !slices.Contains(names, strconv.Itoa(os.Getpid())) {
		return 0
	}
	return first
})

// private is the private resident memory of the process whose /proc
// entry is name, in pages.
func (w *watcher) private(name []byte) int64 {
	if w.statm == nil {
		w.statm = make([]byte, 128)
	}
	p := append(append(w.name[:0], name...), "/statm"...)
	fd, err := unix.Openat(w.dir, string(p), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	n, _ := unix.Read(fd, w.statm)
	unix.Close(fd)
	if n <= 0 {
		return 0
	}
	// size resident shared …
	f := bytes.Fields(w.statm[:n])
	if len(f) < 3 {
		return 0
	}
	res, _ := strconv.ParseInt(string(f[1]), 10, 64)
	shared, _ := strconv.ParseInt(string(f[2]), 10, 64)
	return res - shared
}
