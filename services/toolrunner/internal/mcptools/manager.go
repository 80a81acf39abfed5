package mcptools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/sandbox"
	"floe.dev/services/toolrunner/internal/toolenv"
)

// Restart backoff of a server that died or failed to connect: the delay
// before attempt n (n ≥ 1 consecutive failures) is restartBase·2^(n-1),
// capped. A server that stayed up healthyAfter counts as healthy again.
const (
	restartBase  = 250 * time.Millisecond
	restartCap   = 30 * time.Second
	healthyAfter = 30 * time.Second
	stderrTail   = 2048             // bytes of a stdio server's stderr kept for error messages
	terminate    = 2 * time.Second  // stdin closed → SIGTERM → SIGKILL, each step's wait
	closeWait    = 10 * time.Second // Close waits this long for every server to stop
)

// ErrClosed is returned for a call after Close.
var ErrClosed = errors.New("mcp: toolrunner shutting down")

// Options tune a Manager. Zero fields take their defaults.
type Options struct {
	Log zerolog.Logger
	// Environ builds a stdio server's process environment from the
	// server's declared env ("K=V" entries, which must win). Default
	// toolenv.Environ: the allow-listed part of the toolrunner's
	// environment (FLOE_TOOL_ENV), never its secrets, plus those entries.
	Environ func(extra ...string) []string
	// Lookup resolves ${VAR} in env, headers and url. Default os.LookupEnv.
	Lookup func(string) (string, bool)
	// Name and Version identify Floe to the servers.
	Version string
	// Sandbox confines each stdio server (nil: unconfined). A server has
	// no Session: it sees the system, its declared cwd read-write, and
	// its own /tmp.
	Sandbox *sandbox.Sandbox
}

// Manager holds the connections of one toolrunner to the configured MCP
// servers. Nothing is started until a tool list or a call needs a server
// (lazy start); then each stdio server is one process of this runner,
// restarted with backoff when it dies, and stopped by Close. It is safe
// for concurrent use.
type Manager struct {
	opts    Options
	log     zerolog.Logger
	servers []*server // sorted by name
	byName  map[string]*server
	token   atomic.Uint64

	ctx    context.Context // ends at Close: connects and restarts stop
	cancel context.CancelFunc
	mu     sync.Mutex // guards closed and wg.Add against Close's wg.Wait
	closed bool
	wg     sync.WaitGroup // connects, watchers (one per live session) and their restarts
}

// spawn runs f on a goroutine Close waits for; false once Close began.
func (m *Manager) spawn(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
	return true
}

// NewManager returns a Manager of cfg's servers; nil cfg means none.
func NewManager(cfg *Config, opts Options) *Manager {
	if opts.Environ == nil {
		opts.Environ = toolenv.Environ
	}
	if opts.Lookup == nil {
		opts.Lookup = os.LookupEnv
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	m := &Manager{opts: opts, log: opts.Log, byName: map[string]*server{}}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if cfg != nil {
		for _, name := range cfg.Names() {
			s := &server{m: m, name: name, cfg: cfg.Servers[name], progress: map[string]func(*sdk.ProgressNotificationParams){}}
			s.client = sdk.NewClient(&sdk.Implementation{Name: "floe-toolrunner", Version: opts.Version}, &sdk.ClientOptions{
				Capabilities:                &sdk.ClientCapabilities{},
				ProgressNotificationHandler: s.onProgress,
				ToolListChangedHandler:      s.onToolListChanged,
			})
			m.servers = append(m.servers, s)
			m.byName[name] = s
		}
	}
	return m
}

// Servers returns the configured server names, sorted.
func (m *Manager) Servers() []string {
	names := make([]string, len(m.servers))
	for i, s := range m.servers {
		names[i] = s.name
	}
	return names
}

// List connects every server not yet connected (in parallel, each bounded
// by its connect timeout) and returns the tools of those that are, in
// server order, with one result per server.
func (m *Manager) List(ctx context.Context) ([]*Tool, []omni.MCPConnectResult) {
	results := make([]omni.MCPConnectResult, len(m.servers))
	toolsOf := make([][]*Tool, len(m.servers))
	var wg sync.WaitGroup
	for i, s := range m.servers {
		wg.Go(func() {
			begin := time.Now()
			tools, err := s.ensure(ctx)
			r := omni.MCPConnectResult{Server: s.name, Transport: s.cfg.Transport(), Status: omni.StatusCompleted,
				DurationMs: time.Since(begin).Milliseconds(), Tools: len(tools)}
			if err != nil {
				r.Status, r.Error, r.Tools = omni.StatusFailed, err.Error(), 0
			}
			results[i], toolsOf[i] = r, tools
		})
	}
	wg.Wait()
	var all []*Tool
	for _, ts := range toolsOf {
		all = append(all, ts...)
	}
	return all, results
}

// Lookup returns the tool called name (mcp__<server>__<tool>), connecting
// its server if needed. A server that cannot be reached is an error.
func (m *Manager) Lookup(ctx context.Context, name string) (*Tool, error) {
	rest, ok := strings.CutPrefix(name, toolPrefix)
	if !ok {
		return nil, fmt.Errorf("%q is not an MCP tool name", name)
	}
	srvName, remote, ok := strings.Cut(rest, "__")
	s := m.byName[srvName]
	if !ok || s == nil {
		return nil, fmt.Errorf("no MCP server %q is configured", srvName)
	}
	tools, err := s.ensure(ctx)
	if err != nil {
		return nil, fmt.Errorf("MCP server %q is not available: %w", srvName, err)
	}
	for _, t := range tools {
		if t.remote == remote {
			return t, nil
		}
	}
	return nil, fmt.Errorf("MCP server %q has no tool %q", srvName, remote)
}

// Close stops every server and waits, bounded, until their processes are
// gone. Calls after Close fail with ErrClosed.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	for _, s := range m.servers {
		s.mu.Lock()
		sess := s.sess
		s.mu.Unlock()
		if sess != nil {
			_ = sess.Close()
		}
	}
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeWait):
		m.log.Warn().Msg("MCP servers still stopping after the close wait")
	}
}

// server is one configured MCP server and its current connection.
type server struct {
	m      *Manager
	name   string
	cfg    ServerConfig
	client *sdk.Client

	mu         sync.Mutex // guards the fields below
	sess       *sdk.ClientSession
	tools      []*Tool
	connecting chan struct{} // non-nil while a connect (or a pending restart) is under way; closed when it ends
	lastErr    error
	failures   int // consecutive failures since the server was last healthy
	nextTry    time.Time
	upSince    time.Time
	stale      bool                                             // the server said its tool list changed; relist on next use
	progress   map[string]func(*sdk.ProgressNotificationParams) // by progress token
}

// backoff is the wait before restarting after n consecutive failures.
func backoff(failures int) time.Duration { return retry.Nth(restartBase, restartCap, failures) }

// ensure returns the tools of a live session, connecting if there is none:
// it waits for a connect or restart already under way, and fails at once
// with the last error while a failed server's backoff lasts.
func (s *server) ensure(ctx context.Context) ([]*Tool, error) {
	for {
		s.mu.Lock()
		switch {
		case s.m.ctx.Err() != nil:
			s.mu.Unlock()
			return nil, ErrClosed
		case s.sess != nil && s.stale:
			s.stale = false
			sess, old := s.sess, s.tools
			s.mu.Unlock()
			return s.relist(ctx, sess, old), nil
		case s.sess != nil:
			tools := s.tools
			s.mu.Unlock()
			return tools, nil
		case s.connecting != nil:
			ch := s.connecting
			s.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
		if wait := time.Until(s.nextTry); s.lastErr != nil && wait > 0 {
			err := fmt.Errorf("%w (next attempt in %v)", s.lastErr, wait.Round(100*time.Millisecond))
			s.mu.Unlock()
			return nil, err
		}
		ch := make(chan struct{})
		s.connecting = ch
		s.mu.Unlock()
		// On its own goroutine, so a caller whose ctx ends stops waiting.
		if !s.m.spawn(func() { s.connect(ch) }) {
			s.mu.Lock()
			s.connecting = nil
			s.mu.Unlock()
			close(ch)
		}
	}
}

// connect makes one connection attempt and records its outcome; ch is the
// s.connecting it ends. It runs under the Manager's context, not a
// caller's, since other callers may be waiting for it.
func (s *server) connect(ch chan struct{}) {
	ctx, cancel := context.WithTimeout(s.m.ctx, s.cfg.connectTimeout())
	defer cancel()
	log := s.m.log.With().Str("mcp_server", s.name).Logger()
	sess, stop, tools, err := s.dial(ctx)

	s.mu.Lock()
	defer s.mu.Unlock()
	defer close(ch)
	s.connecting = nil
	if err == nil && s.m.ctx.Err() != nil {
		err = ErrClosed
	}
	if err != nil {
		if sess != nil {
			_ = sess.Close()
		}
		if stop != nil {
			stop()
		}
		s.failures++
		s.lastErr = err
		s.nextTry = time.Now().Add(backoff(s.failures))
		log.Warn().Err(err).Int("failures", s.failures).Msg("MCP server did not connect")
		return
	}
	s.sess, s.tools, s.lastErr, s.upSince = sess, tools, nil, time.Now()
	log.Info().Int("tools", len(tools)).Str("transport", s.cfg.Transport()).Msg("MCP server connected")
	if !s.m.spawn(func() { s.watch(sess, stop) }) {
		s.sess, s.tools = nil, nil
		_ = sess.Close()
		if stop != nil {
			stop()
		}
	}
}

// dial connects and lists the tools. stop, when not nil, ends what dial
// started (the server's process group).
func (s *server) dial(ctx context.Context) (*sdk.ClientSession, func(), []*Tool, error) {
	transport, stop, tail, err := s.transport()
	if err != nil {
		return nil, nil, nil, err
	}
	withTail := func(err error) error {
		if tail != nil {
			tail.settle(time.Second)
			if t := strings.TrimSpace(tail.String()); t != "" {
				return fmt.Errorf("%w; server stderr: %s", err, t)
			}
		}
		return err
	}
	sess, err := s.client.Connect(ctx, transport, nil)
	if err != nil {
		if stop != nil {
			stop()
		}
		return nil, nil, nil, withTail(fmt.Errorf("connect: %w", err))
	}
	var listed []*sdk.Tool
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			_ = sess.Close()
			if stop != nil {
				stop()
			}
			return nil, nil, nil, withTail(fmt.Errorf("list tools: %w", err))
		}
		listed = append(listed, t)
	}
	tools, err := s.makeTools(listed, nil)
	if err != nil {
		return sess, stop, nil, fmt.Errorf("invalid tool list: %w", err)
	}
	return sess, stop, tools, nil
}

// transport builds the server's transport with ${VAR} expanded.
func (s *server) transport() (sdk.Transport, func(), *tailBuffer, error) {
	lookup := s.m.opts.Lookup
	if s.cfg.URL != "" {
		u, err := expand(s.cfg.URL, lookup)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("url: %w", err)
		}
		headers, err := expandMap("header", s.cfg.Headers, lookup)
		if err != nil {
			return nil, nil, nil, err
		}
		return &sdk.StreamableClientTransport{
			Endpoint:             u,
			HTTPClient:           &http.Client{Transport: headerTransport{headers: headers, base: http.DefaultTransport}},
			DisableStandaloneSSE: true,
			MaxRetries:           -1,
		}, nil, nil, nil
	}
	env, err := expandMap("env", s.cfg.Env, lookup)
	if err != nil {
		return nil, nil, nil, err
	}
	extra := make([]string, 0, len(env))
	for k, v := range env {
		extra = append(extra, k+"="+v)
	}
	sb := s.m.opts.Sandbox
	if sb == nil {
		sb = unconfined
	}
	// Its own process group (confined: its own PID namespace), so stopping
	// it reaches whatever it started; and killed with the toolrunner, so
	// no server outlives its runner.
	p, err := sb.Command(context.Background(), sandbox.Spec{
		Argv: append([]string{s.cfg.Command}, s.cfg.Args...), Env: s.m.opts.Environ(extra...),
		Workspace: s.cfg.Cwd, Dir: s.cfg.Cwd, Read: programDirs(s.cfg.Command, s.cfg.Args),
		External: true, // the SDK transport calls Cmd.Start
	})
	if err != nil {
		return nil, nil, nil, err
	}
	cmd := p.Cmd
	// stderr through a pipe of our own, so that a failed connect can wait
	// for what the dying server (or the confining helper, naming a
	// missing command) wrote before it reads the tail: with a plain
	// writer, os/exec copies in a goroutine only Wait waits for, and the
	// error could be read before the message arrived.
	pr, pw, err := os.Pipe()
	if err != nil {
		p.Close()
		return nil, nil, nil, fmt.Errorf("stderr pipe: %w", err)
	}
	tail := &tailBuffer{max: stderrTail, drained: make(chan struct{})}
	go func() {
		_, _ = io.Copy(tail, pr)
		pr.Close()
		close(tail.drained)
	}()
	cmd.Stderr = pw
	var once sync.Once
	stop := func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		once.Do(func() {
			pw.Close() // ours: the copy ends once the server's copies are gone
			p.Close()  // the server's /tmp; the transport reaps the process
		})
	}
	return &sdk.CommandTransport{Command: cmd, TerminateDuration: terminate}, stop, tail, nil
}

// programDirs are the directories a confined stdio server must read: its
// program's, and those of arguments naming existing absolute files (a
// script given to an interpreter) — for a script inside a node_modules
// tree, the directory holding that tree, where its packages resolve.
// Other locations go in FLOE_SANDBOX_READ.
func programDirs(command string, args []string) []string {
	var dirs []string
	if p, err := exec.LookPath(command); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			dirs = append(dirs, filepath.Dir(abs))
		}
	}
	for _, a := range args {
		if filepath.IsAbs(a) {
			if fi, err := os.Stat(a); err == nil && !fi.IsDir() {
				d := filepath.Dir(a)
				if i := strings.Index(d, "/node_modules/"); i > 0 {
					d = d[:i]
				}
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// unconfined starts stdio servers when Options has no Sandbox.
var unconfined, _ = sandbox.New(sandbox.Config{Backend: sandbox.Off})

// watch waits until sess ends, stops what is left of the server and, unless
// the Manager is closing, restarts it after the backoff.
func (s *server) watch(sess *sdk.ClientSession, stop func()) {
	err := sess.Wait()
	_ = sess.Close() // reaps a stdio server's process
	if stop != nil {
		stop()
	}
	s.mu.Lock()
	if s.sess != sess {
		s.mu.Unlock()
		return
	}
	s.sess, s.tools = nil, nil
	if time.Since(s.upSince) >= healthyAfter {
		s.failures = 0
	}
	s.failures++
	s.lastErr = errors.New("server connection ended")
	if err != nil {
		s.lastErr = fmt.Errorf("server connection ended: %w", err)
	}
	if s.m.ctx.Err() != nil {
		s.mu.Unlock()
		return
	}
	delay := backoff(s.failures)
	ch := make(chan struct{})
	s.connecting = ch
	s.mu.Unlock()
	s.m.log.Warn().Str("mcp_server", s.name).Dur("restart_in", delay).Msg("MCP server connection ended; restarting")

	_ = retry.Sleep(s.m.ctx, delay) // a Close cuts the wait; connect sees it
	s.connect(ch)
}

// drop ends a session that failed a call at the transport level, so the
// next call reconnects (a stdio server's death is seen by watch anyway).
func (s *server) drop(sess *sdk.ClientSession) {
	_ = sess.Close()
}

func (s *server) onToolListChanged(context.Context, *sdk.ToolListChangedRequest) {
	s.mu.Lock()
	s.stale = true
	s.mu.Unlock()
}

// relist fetches the tool list of sess again after the server said it
// changed; on any problem the old list stays.
func (s *server) relist(ctx context.Context, sess *sdk.ClientSession, old []*Tool) []*Tool {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.connectTimeout())
	defer cancel()
	var listed []*sdk.Tool
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			s.m.log.Warn().Err(err).Str("mcp_server", s.name).Msg("relisting changed MCP tools failed; keeping the old list")
			return old
		}
		listed = append(listed, t)
	}
	tools, err := s.makeTools(listed, old)
	if err != nil {
		s.m.log.Warn().Err(err).Str("mcp_server", s.name).Msg("changed MCP tool list is invalid; keeping the old list")
		return old
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess == sess {
		s.tools = tools
	}
	return tools
}

func (s *server) onProgress(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
	if req == nil || req.Params == nil {
		return
	}
	token := fmt.Sprint(req.Params.ProgressToken)
	s.mu.Lock()
	f := s.progress[token]
	s.mu.Unlock()
	if f != nil {
		f(req.Params)
	}
}

// session returns the live session, or an error.
func (s *server) session(ctx context.Context) (*sdk.ClientSession, error) {
	if _, err := s.ensure(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess == nil {
		return nil, errors.New("server connection ended")
	}
	return s.sess, nil
}

// headerTransport adds the configured headers to every request.
type headerTransport struct {
	headers map[string]string
	base    http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(h.headers) > 0 {
		r = r.Clone(r.Context())
		for k, v := range h.headers {
			r.Header.Set(k, v)
		}
	}
	return h.base.RoundTrip(r)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
	// drained is closed when the server's stderr has ended (nil: never
	// waited for).
	drained chan struct{}
}

// settle waits, at most d, for the stderr to end: after stop, what the
// server wrote before it died is then all in the buffer.
func (t *tailBuffer) settle(d time.Duration) {
	if t.drained == nil {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-t.drained:
	case <-timer.C:
	}
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
