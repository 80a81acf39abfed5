// Package toolrunner is Floe's tool runner service (protocol.md §7): it executes
// approved tool calls for any number of Sessions and streams their output
// straight onto each Session's subjects.
//
// The engine enqueues an omni.ToolJob on floe.tool.<pool>.<sid> in the
// FLOE_TOOLS work queue once the call's approval_decision is stored. Every
// replica of a pool pulls from one shared durable consumer
// (floe-toolrunner-<pool>), so any number of runners share the work. A job is
// executed at most once: the runner acknowledges it before running it (an
// ack whose answer is lost is sent again until confirmed, never read as
// "not delivered"), and a job whose runner dies is never re-run; the engine
// pairs it with a failed output when the runner's heartbeats stop.
//
// For each job the runner publishes partial_tool_call_output fragments
// (start, deltas, stop) on floe.session.<sid>.partial and then exactly one
// complete tool_call_output on floe.session.<sid>.model, whose Nats-Msg-Id
// (bus.OutputMsgID) lets the stream drop any second copy. While jobs run it
// reports them on floe.hb.<sid> (omni.Heartbeat), stops them when the engine
// publishes omni.Cancel on floe.cancel.<sid>, and answers tool list requests
// on floe.toollist.<pool> (ToolListSubject).
package toolrunner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/ops"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/sandbox"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/toolrunner/internal/mcptools"
	"floe.dev/services/toolrunner/internal/pathlock"
	"floe.dev/services/toolrunner/internal/runner"
	"floe.dev/services/toolrunner/internal/tools"
)

// Defaults of the zero fields of Config.
const (
	DefaultConcurrency       = 8
	DefaultHeartbeatInterval = time.Second
	DefaultMaxOutput         = 16000
	DefaultTimeout           = 120 * time.Second
	DefaultShutdownGrace     = 10 * time.Second
)

// ToolListSubject returns floe.toollist.<pool>: a request there (any body)
// is answered by one runner of the pool with the msgpack omni.ToolList of
// its tools (built-in and MCP) and its MCP servers' connect results.
func ToolListSubject(pool string) string { return runner.ToolListSubject(pool) }

// Config configures one runner. DefaultConfig returns the defaults and
// FromEnv the FLOE_* variables over them; Validate gives zero fields their
// defaults and reports what is still wrong.
type Config struct {
	// Pool is the runner pool whose jobs (floe.tool.<pool>.>) this runner
	// executes. Default omni.DefaultPool.
	Pool string
	// Concurrency is how many jobs run at once; the runner fetches a job
	// only when it has a free slot. Default 8.
	Concurrency int
	// RunnerID names this runner in heartbeats and cancel replies. Default
	// <hostname>-<pid>-<random>.
	RunnerID string
	// HeartbeatInterval is how often running jobs are reported to the
	// engine. Default 1s.
	HeartbeatInterval time.Duration
	// MaxOutput is how many characters of a tool's output are kept (head),
	// the rest replaced by a truncation marker. Default 16000.
	MaxOutput int
	// DefaultTimeout bounds a tool call that asks for no timeout. Default
	// 120s.
	DefaultTimeout time.Duration
	// ShutdownGrace is how long running jobs may keep running once Run's
	// context ends; jobs still running then are cancelled and complete with
	// a failed output. Default 10s.
	ShutdownGrace time.Duration
	// MCPConfig is the path of the MCP servers file (protocol.md §7,
	// FLOE_MCP_CONFIG); empty means no MCP servers. Validate reads it. A
	// stdio server gets the same allow-listed environment as
	// exec_command (FLOE_TOOL_ENV) plus its declared env.
	MCPConfig string
	// Sandbox confines tool processes (protocol.md §7); the zero value is the
	// default (auto). FromEnv reads it (sandbox.ConfigFromEnv, the variables
	// the engine reads for hook commands too).
	Sandbox sandbox.Config
	// Metrics receives the toolrunner's series (nil: none are served).
	Metrics prometheus.Registerer
	// Telemetry traces each tool call (nil: off; see pkg/telemetry).
	Telemetry *telemetry.Provider
	// Replay, when set, serves recorded outputs instead of running any
	// tool (floe replay --execute).
	Replay *Replay
}

// DefaultConfig returns the runner's defaults: the values Validate gives
// zero fields, with a RunnerID of <hostname>-<pid>-<random>.
func DefaultConfig() Config {
	var c Config
	c.fill()
	return c
}

// FromEnv returns DefaultConfig with the FLOE_* variables read through
// getenv (os.Getenv) over it (protocol.md §7, §8): Pool from FLOE_POOL,
// Concurrency from FLOE_TOOL_CONCURRENCY, MCPConfig from FLOE_MCP_CONFIG
// and Sandbox from the sandbox's variables (sandbox.ConfigFromEnv). A value that
// does not parse is an error naming the variable, wrapping
// ErrInvalidConfig.
func FromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	if v := getenv("FLOE_POOL"); v != "" {
		c.Pool = v
	}
	if v := getenv("FLOE_TOOL_CONCURRENCY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return c, fmt.Errorf("%w: FLOE_TOOL_CONCURRENCY=%q: want a count (0: the default)", ErrInvalidConfig, v)
		}
		if n > 0 {
			c.Concurrency = n
		}
	}
	c.MCPConfig = getenv(MCPConfigVar)
	sb, err := sandbox.ConfigFromEnv(getenv)
	if err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c.Sandbox = sb
	return c, nil
}

// Flags registers the runner's own flags on fs, bound to c's fields with
// their current values (FromEnv's) as defaults, so a flag given beats its
// variable: --pool, --concurrency, --mcp-config, --sandbox and
// --sandbox-network.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Pool, "pool", c.Pool, "runner pool whose jobs to run (FLOE_POOL)")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "tool jobs run at once (FLOE_TOOL_CONCURRENCY)")
	fs.StringVar(&c.MCPConfig, "mcp-config", c.MCPConfig, "MCP servers file (FLOE_MCP_CONFIG)")
	c.Sandbox.Flags(fs)
}

// fill sets every zero field to its default.
func (c *Config) fill() {
	if c.Pool == "" {
		c.Pool = omni.DefaultPool
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.RunnerID == "" {
		c.RunnerID = defaultRunnerID()
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.MaxOutput == 0 {
		c.MaxOutput = DefaultMaxOutput
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = DefaultTimeout
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
}

// ErrInvalidConfig is wrapped by every error Validate returns.
var ErrInvalidConfig = errors.New("toolrunner: invalid config")

// Validate sets every zero field to its default, then reports the first
// field that cannot be used, wrapping ErrInvalidConfig. Run calls it.
func (c *Config) Validate() error {
	c.fill()
	switch {
	case !omni.ValidSessionID(c.Pool):
		return fmt.Errorf("%w: pool %q must be one subject token (no dots, wildcards or spaces)", ErrInvalidConfig, c.Pool)
	case c.Concurrency < 1:
		return fmt.Errorf("%w: concurrency %d must be at least 1", ErrInvalidConfig, c.Concurrency)
	case c.RunnerID == "":
		return fmt.Errorf("%w: runner id is empty", ErrInvalidConfig)
	case c.HeartbeatInterval <= 0:
		return fmt.Errorf("%w: heartbeat interval %v must be positive", ErrInvalidConfig, c.HeartbeatInterval)
	case c.MaxOutput < 1:
		return fmt.Errorf("%w: max output %d must be at least 1", ErrInvalidConfig, c.MaxOutput)
	case c.DefaultTimeout <= 0:
		return fmt.Errorf("%w: default timeout %v must be positive", ErrInvalidConfig, c.DefaultTimeout)
	case c.ShutdownGrace < 0:
		return fmt.Errorf("%w: shutdown grace %v must not be negative", ErrInvalidConfig, c.ShutdownGrace)
	}
	if c.MCPConfig != "" {
		if _, err := mcptools.Load(c.MCPConfig); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	// Fail-closed at start: a named backend the host cannot give stops
	// here, with the reason (the host's answer is cached for Run).
	sb, err := openSandbox(c.Sandbox, nil)
	if err != nil {
		return err
	}
	sb.Close()
	return nil
}

// MCPConfigVar is the variable naming the MCP servers file.
const MCPConfigVar = mcptools.ConfigVar

// Run executes tool jobs of cfg.Pool from nc until ctx ends. It waits for
// the FLOE_TOOLS stream to exist (it does not create it: bus.Setup does) and
// creates or joins the pool's shared consumer.
//
// When ctx ends Run stops fetching, lets running jobs finish within
// cfg.ShutdownGrace and then cancels the rest (they complete with a failed
// output), flushes its publishes and returns once every goroutine it started
// has exited. It returns nil after a clean shutdown, an error if cfg is
// invalid or nc closes under it. Run never closes nc.
func Run(ctx context.Context, nc *nats.Conn, cfg Config, log zerolog.Logger) error {
	log = log.With().Str("service", "toolrunner").Logger()
	if err := cfg.Validate(); err != nil {
		return err
	}
	var mcpCfg *mcptools.Config
	if cfg.MCPConfig != "" {
		c, err := mcptools.Load(cfg.MCPConfig)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		mcpCfg = c
	}
	sb, err := openSandbox(cfg.Sandbox, nc)
	if err != nil {
		return err
	}
	defer sb.Close() // after the MCP servers and every job
	logSandbox(log, sb)
	builtin := tools.Builtin(tools.Options{
		MaxOutput:      cfg.MaxOutput,
		DefaultTimeout: cfg.DefaultTimeout,
		Sandbox:        sb,
		Lock:           pathLock(ctx, nc, cfg.RunnerID, log),
	})
	box := mcptools.NewToolbox(builtin, mcptools.NewManager(mcpCfg, mcptools.Options{
		Log:     log.With().Str("runner", cfg.RunnerID).Logger(),
		Sandbox: sb,
	}))
	// The MCP servers stop after the last job: Run has returned.
	defer box.Close()
	m := newMetrics(cfg.Metrics)
	if srv, err := ops.Register(nc, "toolrunner", "Floe tool runner: executes tool calls of pool "+cfg.Pool, func() any {
		return map[string]any{"runner": cfg.RunnerID, "pool": cfg.Pool, "concurrency": cfg.Concurrency}
	}); err != nil {
		log.Warn().Err(err).Msg("not registered as a NATS micro service")
	} else {
		defer srv.Stop()
	}
	return runner.Run(ctx, nc, runner.Config{
		Pool:              cfg.Pool,
		Concurrency:       cfg.Concurrency,
		RunnerID:          cfg.RunnerID,
		HeartbeatInterval: cfg.HeartbeatInterval,
		ShutdownGrace:     cfg.ShutdownGrace,
		Tools:             toolbox(cfg, measured{box, m}),
		Telemetry:         cfg.Telemetry,
		Sandbox:           &omni.SandboxInfo{Backend: string(sb.Backend()), Network: sb.Network()},
	}, log)
}

// pathLock returns the file tools' lock: the floe_locks bucket, so it
// holds across runners; within this process only (with a warning) when
// the layout predates the bucket.
func pathLock(ctx context.Context, nc *nats.Conn, owner string, log zerolog.Logger) tools.LockFunc {
	js, err := jetstream.New(nc)
	if err == nil {
		var kv jetstream.KeyValue
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		kv, err = js.KeyValue(octx, omni.LocksBucket)
		cancel()
		if err == nil {
			return pathlock.New(kv, owner, pathlock.DefaultLease).Lock
		}
	}
	log.Warn().Err(err).Str("bucket", omni.LocksBucket).Msg("no lock bucket (run floe setup): file edits are serialized within this runner only")
	return new(pathlock.Local).Lock
}

// logSandbox logs the backend in effect once; running unconfined because
// nothing was available is a warning.
func logSandbox(log zerolog.Logger, sb *sandbox.Sandbox) {
	mem, pids := sb.Limits()
	if w := sb.Warning(); w != "" {
		log.Warn().Str("sandbox", string(sb.Backend())).Str("reason", w).Msg("tool sandbox: NONE AVAILABLE, tools run unconfined")
		return
	}
	log.Info().Str("sandbox", string(sb.Backend())).Str("network", sb.Network()).
		Int("memory_mb", mem).Int("pids", pids).Msg("tool sandbox")
}

func defaultRunnerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "toolrunner"
	}
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// toolbox is the runner's toolbox: box, or the replay's.
func toolbox(cfg Config, box runner.Toolbox) runner.Toolbox {
	if cfg.Replay != nil {
		return replayBox{cfg.Replay}
	}
	return box
}
