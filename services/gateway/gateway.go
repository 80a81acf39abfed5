// Package gateway is Floe's HTTP front door: the REST API of protocol.md §3 and the
// Server-Sent Events stream of protocol.md §4, served from the bus.
//
// The gateway holds no state: Session records live in the floe_sessions KV
// bucket, Tasks go to the FLOE_TASKS work queue, control requests (approve,
// abort, steer, retry-now, pending) go to the engine that owns a Session,
// and every message a client sees is read from FLOE_SESSIONS or the Trace
// files. Any number of replicas can serve the same Sessions, and an SSE
// client resumes on any of them with its Last-Event-ID.
//
// SSE fan-out: each SSE client has its own ordered JetStream consumer and a
// bounded buffer (Config.ClientBuffer events). A client that stops reading
// never slows the engine or other clients: when its buffer is full it is
// disconnected, and it resumes with Last-Event-ID (the gap is replayed from
// JetStream, or resync_required is sent when the gap left retention).
//
// Run serves on Config.Addr until its context ends; NewHandler returns the
// same API as an http.Handler for tests and embedding.
package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/omni/cmdpolicy"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/gateway/internal/confine"
	"floe.dev/services/gateway/internal/server"
)

// Config configures the gateway. Zero fields take the defaults listed.
type Config struct {
	// Addr is the listen address (default 127.0.0.1:7364).
	Addr string
	// PublicURL (FLOE_PUBLIC_URL) is the gateway's URL as clients reach
	// it, e.g. behind a TLS-terminating proxy: its host is one the gateway
	// answers to, its origin may send writes, and an https URL makes the
	// sign-in cookie Secure. Empty: none.
	PublicURL string
	// AllowedHosts (FLOE_ALLOWED_HOSTS, comma-separated) are more Host
	// names the gateway answers to, besides loopback names, Addr's host and
	// PublicURL's: "name", ".domain" for its subdomains, or "*" for any
	// (only with Tokens). Any other Host gets 403: a page on a name that
	// re-resolves to this machine (DNS rebinding) is refused.
	AllowedHosts []string
	// Tokens maps bearer tokens to principals. Empty disables
	// authentication, which is refused on a non-loopback Addr. With
	// authentication on, a caller sees only the Sessions it created.
	Tokens map[string]string
	// MaxBody caps request bodies in bytes (default 8 MiB, the bus's
	// maximum message size); larger bodies get 413.
	MaxBody int64
	// MaxImport caps a Trace file POST /api/traces/import takes, in bytes
	// (default 32 MiB); that route's body cap is its base64 size plus 64
	// KiB, and a larger body or file gets 413.
	MaxImport int64
	// MaxImports is how many Trace imports run at once (default 2); more
	// get 429 with Retry-After. An import holds about one record in
	// memory (the file is checked into a temporary file as it arrives).
	MaxImports int
	// Home is $FLOE_HOME (required): Traces are read under Home/traces,
	// the tracer's positions under Home/tracer, and default Workspaces are
	// created under Home/workspaces/<session id>.
	Home string
	// DefaultModel is the model of Sessions created without one
	// (default "scripted:demo").
	DefaultModel string
	// CheckModel, when set, checks a new Session's model where the
	// gateway runs with the engine (floe serve, floe chat): a model whose
	// provider key is missing gets 400 model_unavailable naming the
	// variable, instead of a Session whose requests fail and retry. nil
	// (a gateway alone): the engines decide.
	CheckModel func(ref string) error
	// WorkspaceRoots are the directories (FLOE_WORKSPACE_ROOTS) a
	// Session's requested workspace must lie inside, as an existing
	// directory; "/" is never one. Nil means Home/workspaces and the home
	// directory of the user running the gateway. Sessions created without
	// a workspace get Home/workspaces/<session id>, the only directory the
	// gateway ever creates.
	WorkspaceRoots []string
	// ScriptsDir (FLOE_SCRIPTS_DIR) is the directory whose script files a
	// Session may name as scripted:<path>; empty allows scripted:demo
	// only. DefaultModel is the operator's and always allowed.
	ScriptsDir string
	// Heartbeat is the interval of SSE heartbeat comments (default 20s).
	Heartbeat time.Duration
	// ControlTimeout bounds one control request to an engine (default 5s).
	ControlTimeout time.Duration
	// QueueWait is how long abort and steer keep asking when the record says
	// a Task holds the Session but no engine answers yet, e.g. the Task is
	// still queued (default 3s).
	QueueWait time.Duration
	// ClientBuffer is each SSE client's buffer in events (default 1024); a
	// client whose buffer fills is disconnected and resumes with
	// Last-Event-ID.
	ClientBuffer int
	// ReadHeaderTimeout bounds reading a request's headers (default 10s);
	// a client that stalls before its headers end is disconnected.
	ReadHeaderTimeout time.Duration
	// ReadBodyTimeout bounds reading a request's body (default 30s); a
	// client that stalls mid-body gets 408 and is disconnected.
	ReadBodyTimeout time.Duration
	// DetachSSE takes each HTTP/1.1 SSE connection over from net/http once
	// its request is accepted and writes the chunked stream itself: an
	// idle stream then costs about a third of the memory (net/http's
	// buffers and request state are released). Detached connections are
	// not tracked by http.Server (Shutdown does not wait for them, and
	// httptest's CloseClientConnections does not see them); the gateway's
	// release, or Run's shutdown, ends them. floe serve and floe gateway
	// turn it on.
	DetachSSE bool
	// Metrics receives the gateway's series and Gatherer is what /metrics
	// serves (floe serve passes one registry of every service for both);
	// nil: a registry of the gateway's own, with the Go runtime's series.
	Metrics  prometheus.Registerer
	Gatherer prometheus.Gatherer
	// Telemetry traces each request and hands the trace to the Tasks it
	// submits (nil: off; see pkg/telemetry).
	Telemetry *telemetry.Provider
	// WriteTimeout bounds one write to an SSE client (default 15s); a
	// client that accepts nothing for that long is disconnected.
	WriteTimeout time.Duration
	// ShutdownTimeout bounds the graceful shutdown of Run (default 10s).
	ShutdownTimeout time.Duration
	// CommandPolicy is the deployment's command policy (protocol.md §7), copied
	// into each Session at creation; nil is the factory set. Load it from
	// FLOE_COMMAND_POLICY with cmdpolicy.Load.
	CommandPolicy *omni.CommandPolicy
}

// Default values.
const (
	DefaultAddr         = "127.0.0.1:7364"
	DefaultMaxBody      = 8 << 20
	DefaultMaxImport    = 32 << 20
	DefaultModel        = "scripted:demo"
	DefaultHeartbeat    = 20 * time.Second
	DefaultClientBuffer = 1024
)

// DefaultConfig returns the gateway's defaults: the values Validate gives
// zero fields. Home is empty (FromEnv reads FLOE_HOME; it is required),
// and so are WorkspaceRoots until Home is known.
func DefaultConfig() Config {
	var c Config
	c.fill()
	return c
}

// fill sets the zero fields of c to their defaults.
func (c *Config) fill() {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.MaxImport == 0 {
		c.MaxImport = DefaultMaxImport
	}
	if c.MaxImports == 0 {
		c.MaxImports = 2
	}
	if c.DefaultModel == "" {
		c.DefaultModel = DefaultModel
	}
	if c.WorkspaceRoots == nil && c.Home != "" {
		c.WorkspaceRoots = confine.DefaultRoots(c.Home)
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.ControlTimeout == 0 {
		c.ControlTimeout = 5 * time.Second
	}
	if c.QueueWait == 0 {
		c.QueueWait = 3 * time.Second
	}
	if c.ClientBuffer == 0 {
		c.ClientBuffer = DefaultClientBuffer
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.ReadBodyTimeout == 0 {
		c.ReadBodyTimeout = 30 * time.Second
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 15 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
}

// ErrOpenWithoutToken is returned by Validate for a non-loopback Addr
// without any token.
var ErrOpenWithoutToken = errors.New("gateway: refusing to listen on a non-loopback address without an API token (set FLOE_API_TOKEN, or bind 127.0.0.1)")

// Validate sets the zero fields of c to their defaults, then reports the
// first setting that cannot be used and says what to fix. Run and
// NewHandler call it.
func (c *Config) Validate() error {
	c.fill()
	if c.Home == "" {
		return errors.New("gateway: Home is required (FLOE_HOME)")
	}
	if c.MaxBody < 1024 {
		return fmt.Errorf("gateway: MaxBody %d is below 1024 bytes", c.MaxBody)
	}
	if p, m, ok := strings.Cut(c.DefaultModel, ":"); !ok || p == "" || m == "" {
		return fmt.Errorf("gateway: DefaultModel %q is not provider:model_id", c.DefaultModel)
	}
	if err := confine.CheckRoots(c.WorkspaceRoots); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if c.ScriptsDir != "" && !filepath.IsAbs(c.ScriptsDir) {
		return fmt.Errorf("gateway: ScriptsDir %q is not an absolute path", c.ScriptsDir)
	}
	if c.Heartbeat < 0 || c.ControlTimeout < 0 || c.QueueWait < 0 || c.WriteTimeout < 0 || c.ShutdownTimeout < 0 ||
		c.ReadHeaderTimeout < 0 || c.ReadBodyTimeout < 0 {
		return errors.New("gateway: durations must not be negative")
	}
	if c.ClientBuffer < 1 {
		return fmt.Errorf("gateway: ClientBuffer %d must be at least 1", c.ClientBuffer)
	}
	for tok := range c.Tokens {
		if strings.TrimSpace(tok) == "" || strings.ContainsAny(tok, " \t\r\n") {
			return errors.New("gateway: an API token is empty or holds whitespace")
		}
	}
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fmt.Errorf("gateway: Addr %q: %w", c.Addr, err)
	}
	if len(c.Tokens) == 0 && !isLoopback(host) {
		return fmt.Errorf("%w: Addr %s", ErrOpenWithoutToken, c.Addr)
	}
	if c.PublicURL != "" {
		u, err := url.Parse(c.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("gateway: PublicURL %q is not an http(s) URL with a host (FLOE_PUBLIC_URL)", c.PublicURL)
		}
	}
	for _, h := range c.AllowedHosts {
		h = strings.TrimSpace(h)
		if h == "*" && len(c.Tokens) == 0 {
			return errors.New(`gateway: FLOE_ALLOWED_HOSTS "*" needs an API token (any page could otherwise reach the API through DNS rebinding)`)
		}
		if h == "" || strings.ContainsAny(h, "/ \t@") {
			return fmt.Errorf("gateway: allowed host %q is not a host name (FLOE_ALLOWED_HOSTS)", h)
		}
	}
	return nil
}

// isLoopback reports whether host names only the loopback interface; an
// empty host (every interface) or any other name is not.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (c *Config) options() server.Options {
	return server.Options{
		Addr: c.Addr, PublicURL: c.PublicURL, AllowedHosts: c.AllowedHosts,
		Tokens: c.Tokens, MaxBody: c.MaxBody, MaxImport: c.MaxImport, MaxImports: c.MaxImports, Home: c.Home, DefaultModel: c.DefaultModel,
		WorkspaceRoots: c.WorkspaceRoots, ScriptsDir: c.ScriptsDir, ReadBodyTimeout: c.ReadBodyTimeout,
		Heartbeat: c.Heartbeat, ControlTimeout: c.ControlTimeout, QueueWait: c.QueueWait,
		ClientBuffer: c.ClientBuffer, WriteTimeout: c.WriteTimeout, DetachSSE: c.DetachSSE, Metrics: c.Metrics, Gatherer: c.Gatherer, CommandPolicy: c.CommandPolicy,
		Telemetry: c.Telemetry, CheckModel: c.CheckModel,
	}
}

// NewHandler returns the gateway's API on nc as an http.Handler, for tests
// and embedding; the bus layout must exist (bus.Setup). ctx covers setup
// only. release ends every open SSE stream and waits for their handlers; it
// does not close nc.
func NewHandler(ctx context.Context, nc *nats.Conn, cfg Config, log zerolog.Logger) (h http.Handler, release func(), err error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	srv, err := server.New(ctx, nc, cfg.options(), log)
	if err != nil {
		return nil, nil, err
	}
	return srv, srv.Close, nil
}

// Run serves the gateway on cfg.Addr until ctx ends, then shuts down
// gracefully: it stops accepting connections, ends SSE streams (clients
// resume elsewhere with Last-Event-ID), waits up to cfg.ShutdownTimeout for
// in-flight requests and returns after every goroutine it started has
// exited. It does not close nc.
func Run(ctx context.Context, nc *nats.Conn, cfg Config, log zerolog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log = log.With().Str("service", "gateway").Logger()
	srv, err := server.New(ctx, nc, cfg.options(), log)
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("gateway: listen on %s: %w", cfg.Addr, err)
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// net/http's own messages are about single connections (a
		// client that hung up mid-write, a bad TLS hello): debug level.
		ErrorLog: stdlog.New(debugWriter{log}, "", 0),
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	log.Info().Str("addr", ln.Addr().String()).Bool("auth", len(cfg.Tokens) > 0).Msg("gateway listening")

	select {
	case err := <-served:
		return fmt.Errorf("gateway: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	// SSE streams never go idle by themselves: end them (new ones are
	// refused) while Shutdown stops intake and waits for the rest.
	streamsDone := make(chan struct{})
	go func() {
		srv.Close()
		close(streamsDone)
	}()
	err = hs.Shutdown(sctx)
	if err != nil {
		hs.Close() // unblocks writes stuck on unresponsive clients
	}
	<-served
	<-streamsDone
	log.Info().Msg("gateway stopped")
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("gateway: shutdown: %w", err)
	}
	return nil
}

// FromEnv returns DefaultConfig with the FLOE_* variables read through
// getenv (os.Getenv) over it (protocol.md §8): Home from FLOE_HOME, Addr
// from FLOE_HTTP_ADDR, DefaultModel from FLOE_MODEL, Tokens from
// FLOE_API_TOKEN, WorkspaceRoots from FLOE_WORKSPACE_ROOTS (unset: the
// defaults), ScriptsDir from FLOE_SCRIPTS_DIR, PublicURL from
// FLOE_PUBLIC_URL, AllowedHosts from FLOE_ALLOWED_HOSTS (comma-separated)
// and CommandPolicy from FLOE_COMMAND_POLICY (cmdpolicy.Load; its error
// is FromEnv's).
func FromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.Home = getenv("FLOE_HOME")
	if v := getenv("FLOE_HTTP_ADDR"); v != "" {
		c.Addr = v
	}
	if v := getenv("FLOE_MODEL"); v != "" {
		c.DefaultModel = v
	}
	c.Tokens = TokensFromList(getenv("FLOE_API_TOKEN"))
	c.PublicURL = strings.TrimSpace(getenv("FLOE_PUBLIC_URL"))
	for _, h := range strings.Split(getenv("FLOE_ALLOWED_HOSTS"), ",") {
		if h = strings.TrimSpace(h); h != "" {
			c.AllowedHosts = append(c.AllowedHosts, h)
		}
	}
	c.WorkspaceRoots = WorkspaceRootsFromList(getenv("FLOE_WORKSPACE_ROOTS"))
	c.ScriptsDir = getenv("FLOE_SCRIPTS_DIR")
	p, err := cmdpolicy.Load(getenv("FLOE_COMMAND_POLICY"))
	if err != nil {
		return c, fmt.Errorf("gateway: FLOE_COMMAND_POLICY: %w", err)
	}
	c.CommandPolicy = p
	return c, nil
}

// Flags registers the gateway's own flags on fs, bound to c's fields with
// their current values (FromEnv's) as defaults, so a flag given beats its
// variable: --home (FLOE_HOME), --http (FLOE_HTTP_ADDR) and --model
// (FLOE_MODEL). Tokens come from FLOE_API_TOKEN only (argv is public).
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Home, "home", c.Home, "data root shared with the tracer and toolrunners (FLOE_HOME, required)")
	fs.StringVar(&c.Addr, "http", c.Addr, "listen address (FLOE_HTTP_ADDR)")
	fs.StringVar(&c.DefaultModel, "model", c.DefaultModel, "default model of new Sessions, provider:model_id (FLOE_MODEL)")
}

// WorkspaceRootsFromList parses FLOE_WORKSPACE_ROOTS, colon-separated
// directories, into Config.WorkspaceRoots (nil when list is empty: the
// defaults).
func WorkspaceRootsFromList(list string) []string { return confine.Roots(list) }

// DefaultWorkspaceRoots are the roots used when none are configured:
// home/workspaces and the current user's home directory.
func DefaultWorkspaceRoots(home string) []string { return confine.DefaultRoots(home) }

// CheckWorkspace checks that dir is an existing directory inside one of
// roots, never "/", and returns it with its symbolic links resolved: the
// rule the gateway applies to a requested workspace, for other front ends
// (floe run) to apply too.
func CheckWorkspace(dir string, roots []string) (string, error) {
	return confine.Workspace(dir, roots, "")
}

// debugWriter logs each line net/http writes at debug level.
type debugWriter struct{ log zerolog.Logger }

func (d debugWriter) Write(p []byte) (int, error) {
	d.log.Debug().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TokensFromList turns FLOE_API_TOKEN's comma-separated list into
// Config.Tokens. An entry "name:token" gives the token the principal name
// (a name is letters, digits and ._@-; several tokens may share one name);
// a bare token's principal is "token-" and the first 12 hex digits of its
// SHA-256, so the principal never depends on the token's position and
// reordering the list keeps every user's Sessions theirs. A token that
// itself holds a colon is written with a name.
func TokensFromList(list string) map[string]string {
	var tokens map[string]string
	for _, e := range strings.Split(list, ",") {
		name, tok := tokenEntry(e)
		if tok == "" {
			continue
		}
		if tokens == nil {
			tokens = map[string]string{}
		}
		tokens[tok] = name
	}
	return tokens
}

// ClientToken returns the bearer token a client on this machine should send
// for FLOE_API_TOKEN's list: the token of its first entry, without its name
// ("" for an empty list).
func ClientToken(list string) string {
	for _, e := range strings.Split(list, ",") {
		if _, tok := tokenEntry(e); tok != "" {
			return tok
		}
	}
	return ""
}

// tokenEntry parses one entry of FLOE_API_TOKEN's list into its principal
// and token; tok is "" for an empty entry.
func tokenEntry(e string) (principal, tok string) {
	e = strings.TrimSpace(e)
	name, tok, ok := strings.Cut(e, ":")
	name = strings.TrimSpace(name)
	if !ok || !validPrincipal(name) {
		name, tok = "", e
	}
	if tok = strings.TrimSpace(tok); tok == "" {
		return "", ""
	}
	if name == "" {
		sum := sha256.Sum256([]byte(tok))
		name = "token-" + hex.EncodeToString(sum[:6])
	}
	return name, tok
}

// validPrincipal reports whether name may name a token's principal.
func validPrincipal(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '@', r == '-':
		default:
			return false
		}
	}
	return true
}
