// Command floe is Floe's single binary: `floe run` runs one Task with an
// embedded NATS and every service in-process; `floe serve` is the
// all-in-one server; `floe engine|toolrunner|tracer|gateway` run one service
// against an external NATS; `floe replay` prints a Session's stream.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/sandbox"
	"floe.dev/services/engine"
	"floe.dev/services/gateway"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

// command is one `floe` subcommand. run returns the exit status; an error
// is printed as one line "floe <name>: <err>".
type command struct {
	name    string
	args    string // synopsis after the name
	summary string
	run     func(ctx context.Context, stop context.CancelFunc, name string, args []string) (int, error)
}

// commands is the dispatch table, in the order `floe --help` lists them
// (filled by init: the commands' own usage looks it up).
var commands []command

func init() {
	commands = []command{
		{"chat", "[flags]", "talk to an agent in the terminal: in-process, or a running server with --server", cmdChat},
		{"run", "[flags] \"prompt\"", "run one Task in-process (embedded NATS) and render it", cmdRun},
		{"serve", "[flags]", "all-in-one server: embedded JetStream + every service + HTTP gateway", errOnly(cmdServe)},
		{"attach", "<session-id> [flags]", "render a Session live from a gateway", cmdAttach},
		{"sessions", "[--json] [-n N] [--server URL]", "list the recent Sessions: titles, states, Workspaces", cmdSessions},
		{"replay", "<session-id> [flags] | --execute <session-id>|--trace FILE [--diff]", "print a Session's stream from JetStream; with --execute, re-run it from its record and compare the Traces", cmdReplay},
		{"import", "FILE [--model M] [--workspace DIR] [--server URL]", "import a Trace file (Floe's or the original harness's) as a new Session", cmdImport},
		{"export", "<session-id> [--index N] [--server URL]", "write a Session's Trace file to stdout", cmdExport},
		{"fork", "<session-id> [--at SEQ] [--server URL]", "fork a Session at a stream position (default: its end); prints the new id", cmdFork},
		{"tools", "[--pool P] [flags]", "list the tools a running deployment offers, by pool, with their source", errOnly(cmdTools)},
		{"setup", "--nats URL [flags]", "create or update the JetStream layout on an external NATS", errOnly(cmdSetup)},
		{"engine", "--nats URL [flags]", "the engine alone, against an external NATS", cmdService},
		{"toolrunner", "--nats URL [flags]", "the tool runner alone, against an external NATS", cmdService},
		{"tracer", "--nats URL [flags]", "the tracer alone, against an external NATS", cmdService},
		{"gateway", "--nats URL [flags]", "the HTTP gateway alone, against an external NATS", cmdService},
	}
}

func errOnly(f func(context.Context, []string) error) func(context.Context, context.CancelFunc, string, []string) (int, error) {
	return func(ctx context.Context, _ context.CancelFunc, _ string, args []string) (int, error) {
		return 0, f(ctx, args)
	}
}

func usage() string {
	var b strings.Builder
	b.WriteString("floe — an agent harness on NATS JetStream\n\nUsage:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  floe %s %s\n      %s\n", c.name, c.args, c.summary)
	}
	b.WriteString(`  floe --version

Run 'floe <command> --help' for a command's flags. Environment: FLOE_HOME, FLOE_NATS_URL,
FLOE_NATS_LISTEN, FLOE_HTTP_ADDR, FLOE_MODEL, FLOE_API_TOKEN, FLOE_RETRY_BASE_MS,
FLOE_RETRY_CAP_MS, FLOE_RETRY_MAX, FLOE_REQUEST_TIMEOUT_MS, OPENAI_BASE_URL,
OPENAI_API_KEY, ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY; external NATS:
FLOE_NATS_CREDS, FLOE_NATS_USER, FLOE_NATS_PASSWORD, FLOE_NATS_PASSWORD_FILE,
FLOE_REPLICAS, FLOE_SETUP; tools: FLOE_MCP_CONFIG, FLOE_TOOL_ENV, FLOE_SANDBOX,
FLOE_SANDBOX_NETWORK, FLOE_SANDBOX_READ, FLOE_TOOL_MEMORY_MB, FLOE_TOOL_PIDS.
`)
	return b.String()
}

func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage())
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	switch name {
	case "-h", "--help", "help":
		if len(args) > 0 && lookup(args[0]) != nil {
			name, args = args[0], []string{"--help"}
			break
		}
		fmt.Print(usage())
		return
	case "--version", "-version", "version":
		fmt.Println(versionLine())
		return
	}
	cmd := lookup(name)
	if cmd == nil {
		fmt.Fprintf(os.Stderr, "floe: unknown command %q\n\n%s", name, usage())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := cmd.run(ctx, stop, name, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "floe %s: %v\n", name, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// newFlags returns the FlagSet of one command: its usage lists the
// command's own flags only.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("floe "+name, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		if c := lookup(name); c != nil {
			fmt.Fprintf(w, "Usage: floe %s %s\n\n%s.\n\nFlags:\n", c.name, c.args, upperFirst(c.summary))
		}
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args (flags may follow positional arguments). -h prints
// the command's usage on stdout and returns flag.ErrHelp; a bad flag is
// one line pointing at --help.
func parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(interspersed(fs, args))
	fs.SetOutput(os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(os.Stdout)
		fs.Usage()
		return err
	}
	if err != nil {
		return fmt.Errorf("%v (see '%s --help')", err, fs.Name())
	}
	return nil
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = ""

func versionLine() string {
	v, rev := version, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = s.Value[:12]
			}
			if s.Key == "vcs.modified" && s.Value == "true" && rev != "" {
				rev += "+dirty"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	line := "floe " + v
	if rev != "" {
		line += " " + rev
	}
	return line + " " + runtime.Version()
}

// common holds the settings commands share: flag beats variable beats
// default. Each command registers only the groups it uses.
type common struct {
	home      string
	natsURL   string
	listen    string
	httpAddr  string
	model     string
	logLevel  string
	verbose   bool
	retention string
	maxBytes  int64
	auth      natsAuth // credentials for an external NATS (natsauth.go)
	replicas  int
	// getenv reads the services' variables; flagSandbox makes --sandbox
	// and --sandbox-network answer for theirs.
	getenv func(string) string
}

// newCommon reads the environment; flags registered later override it.
func newCommon(listenDefault string) *common {
	return &common{
		home:      defaultHome(),
		natsURL:   os.Getenv("FLOE_NATS_URL"),
		listen:    env("FLOE_NATS_LISTEN", listenDefault),
		httpAddr:  env("FLOE_HTTP_ADDR", "127.0.0.1:7364"),
		model:     defaultModel(),
		logLevel:  env("FLOE_LOG_LEVEL", "info"),
		retention: env("FLOE_RETENTION", ""),
		maxBytes:  envInt("FLOE_RETENTION_BYTES", 0),
		replicas:  int(envInt("FLOE_REPLICAS", 0)),
		auth: natsAuth{creds: os.Getenv("FLOE_NATS_CREDS"), user: os.Getenv("FLOE_NATS_USER"),
			passwordFile: os.Getenv("FLOE_NATS_PASSWORD_FILE")},
		getenv: os.Getenv,
	}
}

// flagSandbox registers --sandbox and --sandbox-network (the confinement
// of tools and hook commands, protocol.md §7) for a command that reads its
// services' configuration after parsing (floe serve).
func (c *common) flagSandbox(fs *flag.FlagSet) {
	c.getenv = sandbox.FlagsEnv(fs, c.getenv)
}

func (c *common) flagHome(fs *flag.FlagSet) {
	fs.StringVar(&c.home, "home", c.home, "data root: Traces, JetStream store, Workspaces, logs (FLOE_HOME)")
}

// flagNATS registers the external NATS URL and its credentials; with
// listen, also the embedded server's listener.
func (c *common) flagNATS(fs *flag.FlagSet, listen bool) {
	fs.StringVar(&c.natsURL, "nats", c.natsURL, "external NATS URL instead of the embedded server (FLOE_NATS_URL)")
	if listen {
		fs.StringVar(&c.listen, "nats-listen", c.listen, "embedded server's client listener, host:port or off (FLOE_NATS_LISTEN)")
	}
	c.auth.register(fs)
}

func (c *common) flagHTTP(fs *flag.FlagSet) {
	fs.StringVar(&c.httpAddr, "http", c.httpAddr, "gateway bind address (FLOE_HTTP_ADDR)")
}

func (c *common) flagModel(fs *flag.FlagSet, what string) {
	fs.StringVar(&c.model, "model", c.model, what+" provider:model_id, e.g. openai:gpt-4o-mini (FLOE_MODEL)")
}

func (c *common) flagLog(fs *flag.FlagSet) {
	fs.StringVar(&c.logLevel, "log-level", c.logLevel, "log level: debug, info, warn, error (FLOE_LOG_LEVEL)")
}

// flagVerbose is the terminal commands' -v: their logs go to a file under
// $FLOE_HOME/logs, and -v shows them on stderr as well.
func (c *common) flagVerbose(fs *flag.FlagSet) {
	fs.BoolVar(&c.verbose, "v", false, "also print the services' logs on stderr (they always go to $FLOE_HOME/logs/)")
}

// fileLogger is the logger of a terminal command: JSON lines appended to
// $FLOE_HOME/logs/floe-<name>.log, and to stderr with -v. The terminal
// stays the Session's.
func (c *common) fileLogger(name string) (zerolog.Logger, func(), error) {
	dir := filepath.Join(c.home, "logs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return zerolog.Nop(), func() {}, fmt.Errorf("log directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "floe-"+name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return zerolog.Nop(), func() {}, fmt.Errorf("log file: %w", err)
	}
	lf := &logFile{f: f}
	var w io.Writer = lf
	if c.verbose {
		w = zerolog.MultiLevelWriter(lf, os.Stderr)
	}
	lvl, err := zerolog.ParseLevel(c.logLevel)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), lf.close, nil
}

// quietLogger is the logger of a one-shot terminal command (fork, import,
// sessions, replay --execute) that starts services in-process: their log
// lines go to $FLOE_HOME/logs/floe-<name>.log, not between the command's
// own output. Without a home to write to (replay --execute --trace on a
// fresh machine), only warnings and errors reach stderr.
func (c *common) quietLogger(name string) (zerolog.Logger, func()) {
	if _, err := os.Stat(c.home); err == nil {
		if log, closeLog, err := c.fileLogger(name); err == nil {
			return log, closeLog
		}
	}
	return c.logger().Level(zerolog.WarnLevel), func() {}
}

// logFile is a terminal command's log file. A service that StopIdle did
// not wait for may still log as it stops after the file was closed; that
// line is dropped. A failed write would make zerolog print "could not
// write event" on the terminal, a second stderr line after the command's
// own (TestChatBadInput failed once so under load).
type logFile struct {
	mu     sync.Mutex
	f      *os.File
	closed bool
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return len(p), nil
	}
	return l.f.Write(p)
}

func (l *logFile) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		l.f.Close()
	}
}

// checkFree fails at once when addr cannot be listened on (another
// process holds it), naming the address and the setting, instead of
// starting half a stack.
func checkFree(addr, setting string) error {
	if addr == "" || addr == "off" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%s is already in use (%s): stop what listens there or choose another address", addr, setting)
		}
		return fmt.Errorf("cannot listen on %s (%s): %v", addr, setting, err)
	}
	return ln.Close()
}

// checkModel checks the model and the provider's key before anything
// starts; the error is a usage error (exit 2).
func checkModel(eng *engine.Config, ref string) error {
	return engine.CheckModel(eng.Providers, ref)
}

// flagLayout registers the JetStream layout settings.
func (c *common) flagLayout(fs *flag.FlagSet) {
	fs.StringVar(&c.retention, "retention", c.retention, "FLOE_SESSIONS max age, e.g. 720h (default unlimited) (FLOE_RETENTION)")
	fs.Int64Var(&c.maxBytes, "retention-bytes", c.maxBytes, "FLOE_SESSIONS max bytes (default unlimited) (FLOE_RETENTION_BYTES)")
	fs.IntVar(&c.replicas, "replicas", c.replicas, "replicas of every stream and bucket: 1 on one server, 3 on a cluster (FLOE_REPLICAS; default: keep the existing layout's, else 1)")
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func defaultHome() string {
	if h := os.Getenv("FLOE_HOME"); h != "" {
		return h
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".floe")
	}
	return ".floe"
}

// defaultModel picks FLOE_MODEL, else a configured provider, else the demo.
func defaultModel() string {
	if m := os.Getenv("FLOE_MODEL"); m != "" {
		return m
	}
	if os.Getenv("OPENAI_API_KEY") != "" {
		return "openai:gpt-4o-mini"
	}
	if os.Getenv("ANTHROPIC_API_KEY") != "" {
		return "anthropic:claude-sonnet-4-5"
	}
	return "scripted:demo"
}

func envInt(name string, def int64) int64 {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	return def
}

func (c *common) busConfig() (bus.Config, error) {
	var b bus.Config
	if c.retention != "" {
		d, err := time.ParseDuration(c.retention)
		if err != nil {
			return b, fmt.Errorf("retention %q: %w", c.retention, err)
		}
		b.MaxAge = d
	}
	b.MaxBytes = c.maxBytes
	b.Replicas = c.replicas
	return b, nil
}

func (c *common) logger() zerolog.Logger {
	lvl, err := zerolog.ParseLevel(c.logLevel)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Logger()
}

// engineConfig is the engine's FromEnv with the settings shared by the
// command's services (--home) over it, validated.
func engineConfig(c *common) (*engine.Config, error) {
	cfg, err := engine.FromEnv(c.getenv)
	if err != nil {
		return nil, err
	}
	cfg.Home = c.home
	denyPorts(&cfg.Hooks.Sandbox, c)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// toolrunnerConfig is the toolrunner's FromEnv, validated: a bad
// FLOE_MCP_CONFIG stops the command at start with the file and position
// named, and a named sandbox backend the host cannot give stops it too
// (fail-closed, one line). Floe's own listeners known here (the gateway,
// the NATS URLs and listener, more addrs such as --metrics) are closed
// to tools.
func toolrunnerConfig(c *common, addrs ...string) (*toolrunner.Config, error) {
	cfg, err := toolrunner.FromEnv(c.getenv)
	if err != nil {
		return nil, err
	}
	denyPorts(&cfg.Sandbox, c, addrs...)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// denyPorts closes Floe's own listeners known here to the processes sb
// confines (tools, hook commands): the gateway, the NATS URLs and
// listener, and addrs (--metrics). The credentials files given by flag
// are hidden like those given by variable.
func denyPorts(sb *sandbox.Config, c *common, addrs ...string) {
	sb.DenyAddrs(append([]string{c.httpAddr, c.listen, c.natsURL}, addrs...)...)
	for _, f := range []string{c.auth.creds, c.auth.passwordFile} {
		if f != "" && !slices.Contains(sb.Hide, f) {
			sb.Hide = append(sb.Hide, f)
		}
	}
}

// tracerConfig is the tracer's FromEnv with --home over it.
func tracerConfig(c *common) (*tracer.Config, error) {
	cfg, err := tracer.FromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	cfg.Home = c.home
	return &cfg, nil
}

// gatewayConfig is the gateway's FromEnv with the command's --home, --http
// and --model over it; SSE connections are detached (Config.DetachSSE).
func gatewayConfig(c *common) (*gateway.Config, error) {
	cfg, err := gateway.FromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	cfg.Addr, cfg.Home, cfg.DefaultModel, cfg.DetachSSE = c.httpAddr, c.home, c.model, true
	return &cfg, nil
}
