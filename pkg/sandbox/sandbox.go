// Package sandbox confines the processes of a tool call to its Session
// (protocol.md §7 "Sandbox"): exec_command's shell and every stdio MCP server.
//
// A confined call sees the system's directories read-only, its Workspace
// read-write and a private /tmp, nothing else: not $FLOE_HOME, not other
// Workspaces, not the credentials files the service was given, and not the
// service's environment (its /proc shows only the call's own PID
// namespace). It cannot open a TCP connection to Floe's own ports (a
// Landlock network ruleset), and with the network off it has no network at
// all (a network namespace). It runs under a memory and a process limit,
// and ends with its call: its PID namespace dies with it, so nothing it
// started — setsid, nohup, a double fork — survives the call's exit,
// timeout, abort or a kill -9 of the toolrunner.
//
// Two backends give this: landlock (namespaces and Landlock, no package
// needed) and bwrap (bubblewrap builds the mount tree; Landlock still
// guards the ports). New picks one, fail-closed: a backend asked for by
// name that the host cannot give is an error, and "auto" falls back to
// off only with a warning.
package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// Backend is the confinement in effect.
type Backend string

// The backends; Auto is only a choice, never in effect.
const (
	Auto     Backend = "auto"
	Landlock Backend = "landlock"
	Bwrap    Backend = "bwrap"
	Off      Backend = "off"
)

// Defaults of the limits.
const (
	DefaultMemoryMB = 2048
	DefaultPids     = 512
)

// SystemDirs are the directories a confined call reads (protocol.md §7).
var SystemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"}

// DefaultDenyPorts are Floe's well-known ports (gateway HTTP 7364; NATS
// client 4222, cluster 6222, monitoring 8222), always unreachable from a
// tool besides the ports the deployment names.
var DefaultDenyPorts = []int{7364, 4222, 6222, 8222}

// Config chooses and tunes the confinement. Zero fields take defaults.
type Config struct {
	// Backend is FLOE_SANDBOX: "auto" (default), "landlock", "bwrap" or
	// "off".
	Backend Backend
	// NetworkOff is FLOE_SANDBOX_NETWORK=off: no network at all. With it
	// on (default) every address but Floe's ports is reachable.
	NetworkOff bool
	// Read are more read-only directories (FLOE_SANDBOX_READ).
	Read []string
	// DenyPorts are Floe's listeners in this deployment (gateway, NATS
	// client, cluster and monitoring, metrics), added to
	// DefaultDenyPorts: no tool may connect to them, on any address.
	DenyPorts []int
	// Hide are credentials files given to the service (the NATS password
	// and creds files): masked even when they lie in a readable directory.
	Hide []string
	// MemoryMB and Pids are the per-call limits (FLOE_TOOL_MEMORY_MB,
	// FLOE_TOOL_PIDS; defaults 2048 and 512).
	MemoryMB int
	Pids     int
}

// ErrUnavailable is wrapped by New's error for a named backend the host
// cannot provide.
var ErrUnavailable = errors.New("sandbox backend not available")

// ParseBackend checks a FLOE_SANDBOX value ("" is auto).
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(strings.ToLower(strings.TrimSpace(s))); b {
	case "":
		return Auto, nil
	case Auto, Landlock, Bwrap, Off:
		return b, nil
	}
	return "", fmt.Errorf("FLOE_SANDBOX %q: want auto, landlock, bwrap or off", s)
}

// ParseNetwork checks a FLOE_SANDBOX_NETWORK value ("" is on) and returns
// whether the network is off.
func ParseNetwork(s string) (off bool, err error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "on":
		return false, nil
	case "off":
		return true, nil
	}
	return false, fmt.Errorf("FLOE_SANDBOX_NETWORK %q: want on or off", s)
}

// Sandbox starts confined processes. It is safe for concurrent use.
type Sandbox struct {
	cfg     Config
	backend Backend
	warning string
	exe     string   // the helper: this binary
	bwrap   string   // bwrap's path
	net     *os.File // the Landlock network ruleset, nil with network off or backend off
	sp      *spawner
	closed  sync.Once
}

// New returns the Sandbox cfg asks for, after checking (by running a
// confined `true`) that the host provides it. A named backend the host
// cannot provide is an error wrapping ErrUnavailable; Auto takes bwrap,
// else landlock, else off with Warning set.
func New(cfg Config) (*Sandbox, error) {
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = DefaultMemoryMB
	}
	if cfg.Pids == 0 {
		cfg.Pids = DefaultPids
	}
	if cfg.Backend == "" {
		cfg.Backend = Auto
	}
	if cfg.MemoryMB < 0 || cfg.Pids < 0 {
		return nil, fmt.Errorf("sandbox: limits must not be negative (memory %d MB, %d processes)", cfg.MemoryMB, cfg.Pids)
	}
	switch cfg.Backend {
	case Off:
		return &Sandbox{cfg: cfg, backend: Off}, nil
	case Landlock, Bwrap:
		s, err := open(cfg, cfg.Backend)
		if err != nil {
			return nil, fmt.Errorf("%w: FLOE_SANDBOX=%s: %w", ErrUnavailable, cfg.Backend, err)
		}
		return s, nil
	case Auto:
		var reasons []string
		// The cheaper first. As root the landlock backend starts calls
		// directly (direct.go: no helper, no per-call Landlock layer),
		// about 1 ms over an unconfined start where bwrap costs its own
		// exec and setup plus the helper's (BenchmarkTrue). Otherwise it
		// needs the helper and a per-call Landlock layer that copies the
		// 65k port rules of the network layer below it, and bwrap is the
		// cheaper.
		order := []Backend{Bwrap, Landlock}
		if os.Geteuid() == 0 {
			order = []Backend{Landlock, Bwrap}
		}
		for _, b := range order {
			s, err := open(cfg, b)
			if err == nil {
				return s, nil
			}
			reasons = append(reasons, fmt.Sprintf("%s: %v", b, err))
		}
		return &Sandbox{cfg: cfg, backend: Off, warning: "no sandbox backend available, tools run UNCONFINED (" + strings.Join(reasons, "; ") + ")"}, nil
	}
	return nil, fmt.Errorf("sandbox: unknown backend %q", cfg.Backend)
}

// probes caches, per backend and network setting, whether the host
// provides it: the answer does not change while the process lives, and a
// probe costs a confined process start.
var probes sync.Map // probeKey → error (nil: works)

type probeKey struct {
	b   Backend
	off bool
}

func open(cfg Config, b Backend) (*Sandbox, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable for the helper: %w", err)
	}
	s := &Sandbox{cfg: cfg, backend: b, exe: exe}
	abi := landlockABI()
	if b == Bwrap {
		if s.bwrap, err = exec.LookPath("bwrap"); err != nil {
			return nil, errors.New("bwrap not found in PATH (Debian: apt-get install bubblewrap)")
		}
	}
	if b == Landlock && abi < 1 {
		return nil, errors.New("the kernel has no Landlock (needs Linux 5.13 with landlock in lsm=)")
	}
	if !cfg.NetworkOff {
		deny := map[int]bool{}
		for _, p := range append(slices.Clone(DefaultDenyPorts), cfg.DenyPorts...) {
			deny[p] = true
		}
		if s.net, err = netRuleset(abi, deny, true); err != nil {
			return nil, fmt.Errorf("floe's ports cannot be closed to tools: %w", err)
		}
	}
	if b == Landlock && os.Geteuid() == 0 {
		// The direct start when this host has what it needs (a procfs
		// per PID namespace, the new mount API); else the helper's.
		if s.sp, err = newSpawner(s.net, cfg.NetworkOff, true); err == nil {
			if err = s.probe(); err == nil {
				return s, nil
			}
			s.sp.close()
		}
	}
	if s.sp, err = newSpawner(s.net, cfg.NetworkOff && os.Geteuid() == 0, false); err != nil {
		s.Close()
		return nil, fmt.Errorf("prepare the spawner thread: %w", err)
	}
	key := probeKey{b, cfg.NetworkOff}
	if v, ok := probes.Load(key); ok {
		if v != nil {
			s.Close()
			return nil, v.(error)
		}
		return s, nil
	}
	err = s.probe()
	if err != nil {
		probes.Store(key, err)
		s.Close()
		return nil, err
	}
	probes.Store(key, nil)
	return s, nil
}

// probe runs `true` confined.
func (s *Sandbox) probe() error {
	dir, err := os.MkdirTemp("", "floe-sandbox-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := s.Command(context.Background(), Spec{Argv: []string{"true"}, Workspace: dir, Dir: dir, Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		return err
	}
	defer p.Close()
	var stderr bytes.Buffer
	p.Cmd.Stderr = &stderr
	err = p.Run()
	ex := p.Exit(err)
	if ex.Code != 0 || ex.Signal != "" || ex.Error != "" {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = ex.Error
		}
		if msg == "" && err != nil {
			msg = err.Error()
		}
		return fmt.Errorf("a confined test process failed: %s", msg)
	}
	return nil
}

// Backend returns the backend in effect.
func (s *Sandbox) Backend() Backend { return s.backend }

// Network returns "on" or "off", the network setting in effect ("on"
// when the backend is off: nothing is confined).
func (s *Sandbox) Network() string {
	if s.cfg.NetworkOff && s.backend != Off {
		return "off"
	}
	return "on"
}

// Warning is set when Auto found no backend: tools run unconfined.
func (s *Sandbox) Warning() string { return s.warning }

// Limits returns the per-call memory (MB) and process limits.
func (s *Sandbox) Limits() (memoryMB, pids int) { return s.cfg.MemoryMB, s.cfg.Pids }

// Close releases the network ruleset and the spawner thread, kills the
// processes still running that it started (every process of every call),
// and returns once every goroutine of the Sandbox has ended. A start after
// Close fails. Call it last: a call still running is killed, but its
// namespace ends (and Close returns) only once the call's Cmd.Wait reaped
// it. Calling it again does nothing.
func (s *Sandbox) Close() {
	s.closed.Do(func() {
		if s.sp != nil {
			s.sp.close()
		}
		if s.net != nil {
			s.net.Close()
		}
	})
}

// Spec is one process to start confined.
type Spec struct {
	Argv []string
	// Env is the process's whole environment (the tool environment; never
	// the service's). TMPDIR is set to the private /tmp.
	Env []string
	// Workspace is the directory the process may write ("" for none).
	Workspace string
	// Dir is the working directory, an absolute path ("" for the
	// Workspace).
	Dir string
	// Read are more paths this process may read (an MCP server's
	// program), besides the system's.
	Read []string
	// External says the caller starts Cmd itself (Cmd.Start, as an MCP
	// transport does) rather than with Proc.Start: the call then goes
	// through the helper (a few milliseconds more).
	External bool
}

// Proc is a confined process, not yet started: set Cmd's Stdin, Stdout,
// Stderr (and Cancel), start it, then read Exit and Close.
type Proc struct {
	Cmd    *exec.Cmd
	sb     *Sandbox
	spec   initSpec
	ws     string
	read   []string
	status *os.File // read end of the helper's report
	closeW *os.File // write end, until Exit
	tmp    string
	// A direct start (direct.go): the watcher, and the end of the call
	// (closed once its command exited and the rest of it was killed;
	// limit set).
	direct bool
	limits *limits
	exited chan struct{} // closed once the command has exited
	ended  chan struct{}
	limit  string
	// tracked: a helper forked by the spawner, which kills it on Close.
	tracked bool
}

// Exit is a confined process's outcome.
type Exit struct {
	Code   int
	Signal string // the signal that ended the command ("killed"), if any
	// Limit is "memory" or "processes" when the call was killed for
	// exceeding that limit.
	Limit string
	// Error is set when the confinement itself failed to start.
	Error string
}

// Command prepares spec's process, confined. When ctx ends the process
// and everything it started are killed (Cmd.Cancel). Start it with
// Proc.Start (cheap: forked from the Sandbox's restricted thread); a
// caller that must call Cmd.Start itself (an MCP transport) may, the
// helper then restricts the call itself (about 0.1 s more).
func (s *Sandbox) Command(ctx context.Context, spec Spec) (*Proc, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("sandbox: empty command")
	}
	dir := spec.Dir
	if dir == "" {
		dir = spec.Workspace
	}
	if s.backend == Off {
		cmd := exec.CommandContext(ctx, spec.Argv[0], spec.Argv[1:]...)
		cmd.Env, cmd.Dir = spec.Env, dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		cmd.Cancel = func() error { return killGroup(cmd) }
		return &Proc{Cmd: cmd, sb: s}, nil
	}
	if s.sp != nil && s.sp.direct && !spec.External {
		// Started by Proc.Start from the spawner thread (direct.go); a
		// Cmd.Start fails rather than run anything unconfined. The
		// command is looked up there, in the call's view: "/" spares a
		// lookup on the host's PATH here.
		cmd := exec.CommandContext(ctx, "/")
		cmd.Args, cmd.Env = slices.Clone(spec.Argv), spec.Env
		cmd.Err = errors.New("sandbox: a confined process is started with Proc.Start")
		cmd.Cancel = func() error { return cmd.Process.Kill() }
		return &Proc{Cmd: cmd, sb: s, spec: initSpec{Argv: spec.Argv, Dir: dir}, ws: spec.Workspace, read: spec.Read, direct: true}, nil
	}
	tmp, err := os.MkdirTemp("", "floe-tool-")
	if err != nil {
		return nil, fmt.Errorf("sandbox: private temp dir: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("sandbox: status pipe: %w", err)
	}
	is := initSpec{Mode: s.backend, Argv: spec.Argv, Dir: dir, StatusFD: 3, NetFD: -1,
		MemoryMB: s.cfg.MemoryMB, Pids: s.cfg.Pids}
	if s.backend == Landlock {
		is.Tmp = tmp
		is.RO = append(append(append(slices.Clone(SystemDirs), s.cfg.Read...), spec.Read...), "/proc", "/dev")
		is.RW = []string{"/tmp", "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}
		if spec.Workspace != "" {
			is.RW = append(is.RW, spec.Workspace)
		}
		is.Hide = s.cfg.Hide
	}
	var cmd *exec.Cmd
	if s.backend == Bwrap {
		cmd = exec.CommandContext(ctx, s.bwrap)
	} else {
		cmd = exec.CommandContext(ctx, "/proc/self/exe")
	}
	cmd.Env = append(slices.Clone(spec.Env), initEnv+"=1")
	// The helper is the call: killing it (PID 1 of the namespace, or
	// bwrap whose namespace init dies with it) kills every process of
	// the call.
	cmd.Cancel = func() error { return killGroup(cmd) }
	// Our copy of the write end is closed by Exit, after Wait, before the
	// report is read (the helper's copy is gone with it, and no process of
	// the call inherits one).
	p := &Proc{Cmd: cmd, sb: s, spec: is, ws: spec.Workspace, read: spec.Read, status: r, closeW: w, tmp: tmp}
	p.build(false)
	return p, nil
}

// build sets the command line, inherited files and namespaces of the
// helper; spawned says it is forked from the spawner thread, which already
// holds the network ruleset (and, network off, the empty network
// namespace).
func (p *Proc) build(spawned bool) {
	s, is, cmd := p.sb, p.spec, p.Cmd
	cmd.ExtraFiles = []*os.File{p.closeW} // fd 3
	netns := s.cfg.NetworkOff
	if spawned {
		netns = netns && !s.sp.netns
	} else if s.net != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, s.net) // fd 4
		is.NetFD = 4
	}
	arg, _ := json.Marshal(is)
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	switch s.backend {
	case Landlock:
		cmd.Args = []string{"/proc/self/exe", string(arg)}
		attr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC
		if netns {
			attr.Cloneflags |= syscall.CLONE_NEWNET
		}
		if os.Geteuid() != 0 {
			attr.Cloneflags |= syscall.CLONE_NEWUSER
			attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: os.Geteuid(), HostID: os.Geteuid(), Size: 1}}
			attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getegid(), HostID: os.Getegid(), Size: 1}}
		}
	case Bwrap:
		cmd.Args = append(append([]string{s.bwrap}, s.bwrapArgs(p.ws, is.Dir, p.tmp, p.read, netns)...), "--", "/.floe-sandbox-init", string(arg))
	}
	cmd.SysProcAttr = attr
}

// Start starts the process from the spawner thread.
func (p *Proc) Start() error {
	if p.sb.backend == Off || p.sb.sp == nil {
		return p.Cmd.Start()
	}
	var err error
	if p.direct {
		if e := p.sb.sp.run(func() { err = p.startDirect() }); e != nil {
			return e
		}
		return err
	}
	p.build(true)
	if e := p.sb.sp.run(func() { err = p.Cmd.Start() }); e != nil {
		return e
	}
	if err == nil {
		p.tracked = p.sb.sp.track(p.Cmd.Process)
	}
	return err
}

// Run is Start then Cmd.Wait.
func (p *Proc) Run() error {
	if err := p.Start(); err != nil {
		return err
	}
	if p.exited != nil {
		// A direct start: wait for the exit in the runtime's poller
		// first (endCall), so that no thread sits in Cmd.Wait's
		// blocking waitid(2) while the call runs.
		<-p.exited
	}
	return p.Cmd.Wait()
}

func killGroup(cmd *exec.Cmd) error {
	return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// bwrapArgs builds bubblewrap's view: the system read-only (a link stays
// a link), the Workspace read-write at its own path, a private /tmp, a
// fresh /proc of the call's PID namespace, a minimal /dev, the helper,
// and the hidden files masked.
func (s *Sandbox) bwrapArgs(ws, dir, tmp string, read []string, netns bool) []string {
	a := []string{"--die-with-parent", "--unshare-pid", "--unshare-ipc", "--new-session"}
	if netns {
		a = append(a, "--unshare-net")
	}
	var ro []string
	for _, d := range append(slices.Clone(SystemDirs), s.cfg.Read...) {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			if t, err := os.Readlink(d); err == nil {
				a = append(a, "--symlink", t, d)
			}
		default:
			a = append(a, "--ro-bind", d, d)
			ro = append(ro, d)
		}
	}
	// /proc read-only: uid 0 (bubblewrap run by root) may write most of
	// /proc/sys by file mode alone, and bubblewrap covers /proc/sys only
	// when it finds the directory itself writable.
	a = append(a, "--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev", "--bind", tmp, "/tmp")
	for _, r := range read {
		a = append(a, "--ro-bind-try", r, r)
	}
	if ws != "" {
		a = append(a, "--bind", ws, ws)
	}
	for _, f := range s.cfg.Hide {
		for _, d := range ro {
			if f == d || strings.HasPrefix(f, d+"/") {
				if _, err := os.Stat(f); err == nil {
					a = append(a, "--ro-bind", "/dev/null", f)
				}
				break
			}
		}
	}
	a = append(a, "--ro-bind", s.exe, "/.floe-sandbox-init")
	if dir != "" {
		a = append(a, "--chdir", dir)
	}
	return a
}

// Exit returns the outcome once Cmd has been waited for; waitErr is what
// Wait (or Run) returned.
func (p *Proc) Exit(waitErr error) Exit {
	if p.sb.backend == Off || p.direct {
		limit := ""
		if p.ended != nil {
			<-p.ended
			limit = p.limit
		}
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return Exit{Code: -1, Signal: ws.Signal().String(), Limit: limit}
			}
			return Exit{Code: ee.ExitCode(), Limit: limit}
		}
		if waitErr != nil && !errors.Is(waitErr, exec.ErrWaitDelay) {
			return Exit{Code: -1, Error: waitErr.Error(), Limit: limit}
		}
		return Exit{Limit: limit}
	}
	p.closeWrite()
	b, _ := io.ReadAll(io.LimitReader(p.status, 4096))
	var st status
	if err := json.Unmarshal(bytes.TrimSpace(b), &st); err != nil {
		// No report: the helper was killed (timeout, abort), taking the
		// call's namespace with it.
		return Exit{Code: -1, Signal: syscall.SIGKILL.String()}
	}
	ex := Exit{Code: st.Code, Limit: st.Limit, Error: st.Error}
	if st.Signal != 0 {
		ex.Code, ex.Signal = -1, syscall.Signal(st.Signal).String()
	}
	return ex
}

func (p *Proc) closeWrite() {
	if p.closeW != nil {
		p.closeW.Close()
		p.closeW = nil
	}
}

// Close releases what the Proc holds and deletes its private /tmp. Call
// it after Wait.
func (p *Proc) Close() {
	if p.tracked {
		p.sb.sp.untrack(p.Cmd.Process)
		p.tracked = false
	}
	if p.ended != nil {
		<-p.ended
	}
	p.closeWrite()
	if p.status != nil {
		p.status.Close()
	}
	if p.tmp != "" {
		os.RemoveAll(p.tmp)
	}
}
