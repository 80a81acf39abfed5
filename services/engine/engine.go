// Package engine runs Floe's agent loop as a service: it takes Tasks from
// the FLOE_TASKS work queue (any number of replicas share it), runs each as
// the seed describes, and publishes every message on the Session's subjects
// in FLOE_SESSIONS. Tool calls go to runners through FLOE_TOOLS.
package engine

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/ops"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/sandbox"
	"floe.dev/pkg/telemetry"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine/internal/fold"
	"floe.dev/services/engine/internal/hooks"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider"
	"floe.dev/services/engine/internal/purge"
	"floe.dev/services/engine/internal/snapshot"
	"floe.dev/services/engine/internal/task"
)

// Config configures an engine replica.
type Config struct {
	// Pool is the runner pool tool jobs go to (default "default").
	Pool string
	// MaxTasks is how many Tasks this replica runs at once (default 64).
	MaxTasks int
	// RetryBase, RetryCap and RetryMax shape the reconnect ladder
	// (defaults 2 s, 30 s, 5: FLOE_RETRY_BASE_MS, FLOE_RETRY_CAP_MS, FLOE_RETRY_MAX).
	RetryBase time.Duration
	RetryCap  time.Duration
	RetryMax  int
	// RequestTimeout is the model idle timeout (default 120 s, FLOE_REQUEST_TIMEOUT_MS).
	RequestTimeout time.Duration
	// HeartbeatTimeout: a running tool job silent this long is lost (default 10 s).
	HeartbeatTimeout time.Duration
	// CancelWait bounds how long abort waits for runners to confirm (default 3 s).
	CancelWait time.Duration
	// AckWait is how long a Task may go without a progress ack before
	// another engine takes it over (default 30 s; progress is acked every AckWait/3).
	AckWait time.Duration
	// DefaultMaxTurns applies to Sessions without maxTurns (0 = unlimited).
	DefaultMaxTurns int
	// Providers holds model endpoints and keys.
	Providers provider.Config
	// Durable names the shared task consumer (default "floe-engine").
	Durable string
	// Home is $FLOE_HOME: a Session resumes from its Trace files there when
	// they exist (else from the stream alone).
	Home string
	// NoSnapshots folds every Task's whole history instead of starting
	// from the Session's context snapshot (docs/history-window.md).
	// Unstable, for comparing: FLOE_SNAPSHOTS=off.
	NoSnapshots bool
	// Retention is how long ended Tasks' partials and idle Sessions stay
	// in FLOE_SESSIONS.
	Retention
	// MaxSubagentDepth is how deep run_subagent may nest (default 1;
	// negative disables subagents).
	MaxSubagentDepth int
	// Metrics receives the engine's series (nil: none are served).
	Metrics prometheus.Registerer
	// Hooks are the deployment's hooks and the sandbox of their commands.
	Hooks Hooks
	// Telemetry traces each Task (nil: off; see pkg/telemetry).
	Telemetry *telemetry.Provider
}

// Retention is what the engine purges from FLOE_SESSIONS, and when
// (purge.Purger).
type Retention struct {
	// PartialsKeep is how long an ended Task's partial messages stay in
	// FLOE_SESSIONS before they are purged (FLOE_PARTIALS_KEEP, a Go
	// duration; default 1h; 0 purges at the Task's end; negative or "off"
	// keeps them). The complete messages and the Trace keep everything.
	PartialsKeep time.Duration
	// partialsKeepSet: PartialsKeep was given (0 is a value, not unset).
	partialsKeepSet bool
	// IdleKeep is how long a Session that runs no Task stays in
	// FLOE_SESSIONS after its last message before every message of it is
	// purged, once the tracer has written it (FLOE_IDLE_KEEP, a Go
	// duration; default 1h; negative or "off" keeps them; purge.Purger).
	// Off without Home: an engine that cannot read the Traces resumes a
	// Session from the stream alone.
	IdleKeep time.Duration
	// idleKeepSet: IdleKeep was given (0 is a value, not unset).
	idleKeepSet bool
}

// DefaultConfig returns the engine's defaults: the values Validate gives
// zero fields, and RetryMax 5 (a zero RetryMax means no reconnects).
func DefaultConfig() Config {
	c := Config{RetryMax: 5}
	c.fill()
	return c
}

// fill sets unset fields to their defaults.
func (c *Config) fill() {
	if c.PartialsKeep == 0 && !c.partialsKeepSet {
		c.PartialsKeep = purge.DefaultKeep
	}
	if c.IdleKeep == 0 && !c.idleKeepSet {
		c.IdleKeep = purge.DefaultIdleKeep
	}
	if c.Pool == "" {
		c.Pool = omni.DefaultPool
	}
	if c.MaxTasks <= 0 {
		c.MaxTasks = 64
	}
	if c.RetryBase <= 0 {
		c.RetryBase = 2 * time.Second
	}
	if c.RetryCap <= 0 {
		c.RetryCap = 30 * time.Second
	}
	if c.RetryMax < 0 {
		c.RetryMax = 0
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 120 * time.Second
	}
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 10 * time.Second
	}
	if c.CancelWait <= 0 {
		c.CancelWait = 3 * time.Second
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxSubagentDepth == 0 {
		c.MaxSubagentDepth = 1
	}
	if c.Durable == "" {
		c.Durable = "floe-engine"
	}
	c.Providers.RequestTimeout = c.RequestTimeout
}

// Validate sets unset fields to their defaults (as DefaultConfig, but a
// zero RetryMax stays 0) and reports the first setting that cannot be
// used, naming its variable. Run calls it.
func (c *Config) Validate() error {
	c.fill()
	if c.RetryCap < c.RetryBase {
		return fmt.Errorf("engine: retry cap %v is below retry base %v", c.RetryCap, c.RetryBase)
	}
	if !omni.ValidSessionID(c.Pool) {
		return fmt.Errorf("engine: pool %q is not a valid subject token", c.Pool)
	}
	if c.Hooks.File != "" {
		if _, err := hooks.Load(c.Hooks.File); err != nil {
			return fmt.Errorf("engine: FLOE_HOOKS: %w", err)
		}
	}
	if c.AckWait > 0 && c.AckWait < 300*time.Millisecond {
		return fmt.Errorf("engine: ack wait %v (FLOE_ENGINE_ACK_WAIT_MS) is below 300 ms: the engine acks progress every third of it", c.AckWait)
	}
	return nil
}

// Run serves Tasks until ctx ends, then stops taking Tasks, lets running
// ones hand over (they are redelivered to another engine, which resumes
// them from the stream) and returns after every goroutine exits.
func Run(ctx context.Context, nc *nats.Conn, cfg Config, log zerolog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log = log.With().Str("service", "engine").Logger()
	e := &engine{cfg: cfg, nc: nc, log: log}
	// Every publish to FLOE_SESSIONS goes through a Task's ordered
	// publishers (pkg/bus/publish); nothing is published asynchronously.
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("engine: jetstream: %w", err)
	}
	e.js = js
	pubJS, closePub, err := bus.PublishJS(nc)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	defer closePub()
	sessions, err := bus.Open(ctx, js)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	cons, err := taskConsumer(ctx, js, &cfg, log)
	if err != nil {
		return err
	}
	e.cfg.AckWait = cfg.AckWait
	reg := provider.NewRegistry(cfg.Providers)
	e.metrics = newMetrics(cfg.Metrics)
	resolve := func(ref string) (model.Provider, model.Info, error) {
		p, info, err := reg.Resolve(ref)
		if err == nil {
			p = measuredProvider{Provider: p, name: info.Provider, m: e.metrics}
		}
		return p, info, err
	}
	if srv, err := ops.Register(nc, "engine", "Floe engine: runs Tasks of pool "+cfg.Pool, func() any {
		return map[string]any{"pool": cfg.Pool, "max_tasks": cfg.MaxTasks, "tasks_running": e.running.Load()}
	}); err != nil {
		log.Warn().Err(err).Msg("not registered as a NATS micro service")
	} else {
		defer srv.Stop()
	}
	hookRunner, closeHooks, err := openHooks(cfg.Hooks, nc, log)
	if err != nil {
		return err
	}
	defer closeHooks()
	e.deps = &task.Deps{
		Hooks:      hookRunner,
		NC:         nc,
		JS:         js,
		PubJS:      pubJS,
		Sessions:   sessions,
		Log:        log,
		Resolve:    resolve,
		Tools:      e.listTools,
		MCPServers: e.mcpServers,
		Tel:        cfg.Telemetry,
		Settings: task.Settings{
			Pool:             cfg.Pool,
			RetryBase:        cfg.RetryBase,
			RetryCap:         cfg.RetryCap,
			RetryMax:         cfg.RetryMax,
			HeartbeatTimeout: cfg.HeartbeatTimeout,
			CancelWait:       cfg.CancelWait,
			ToolListTimeout:  30 * time.Second,
			DefaultMaxTurns:  cfg.DefaultMaxTurns,
			MaxSubagentDepth: max(cfg.MaxSubagentDepth, 0),
			Home:             cfg.Home,
			AckWait:          cfg.AckWait,
		},
	}
	if !cfg.NoSnapshots {
		e.deps.Snapshots = snapshot.Open(ctx, js, cfg.Home, log)
	}
	log.Info().Int("max_tasks", cfg.MaxTasks).Msg("engine started")
	idle := cfg.IdleKeep >= 0 && cfg.Home != ""
	if cfg.IdleKeep >= 0 && cfg.Home == "" {
		log.Info().Msg("no FLOE_HOME: idle Sessions stay on the stream (FLOE_IDLE_KEEP needs the Traces)")
	}
	if cfg.PartialsKeep >= 0 || idle {
		p := purge.New(js, cfg.PartialsKeep, log)
		if cfg.PartialsKeep >= 0 {
			e.deps.PartialsEnded = p.Ended
		}
		if idle {
			in := purge.Idle{Keep: cfg.IdleKeep, Records: sessions}
			if e.deps.Snapshots != nil {
				in.Snapshots = e.deps.Snapshots
			}
			p.SetIdle(in)
			e.deps.TaskEnded = p.TaskEnded
		}
		pctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			// What an engine that stopped left pending (purge.Recover).
			if n, err := p.Recover(pctx, sessions); err != nil && pctx.Err() == nil {
				log.Warn().Err(err).Msg("cannot recover pending purges")
			} else if n > 0 {
				log.Info().Int("sessions", n).Msg("recovered pending purges of partials")
			}
			p.Run(pctx)
		}()
		defer func() { stop(); <-done }()
	}
	return e.loop(ctx, cons)
}

// SetPartialsKeep sets PartialsKeep, 0 included (Validate leaves it).
func (c *Retention) SetPartialsKeep(d time.Duration) { c.PartialsKeep, c.partialsKeepSet = d, true }

// SetIdleKeep sets IdleKeep, 0 included (Validate leaves it).
func (c *Retention) SetIdleKeep(d time.Duration) { c.IdleKeep, c.idleKeepSet = d, true }

// keepFromEnv reads a keep variable's value v: a duration, or off (-1);
// empty leaves the default.
func keepFromEnv(v, name string, set func(time.Duration)) error {
	switch v {
	case "":
		return nil
	case "off":
		set(-1)
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("%s=%q: want a duration (1h, 10m, 0s) or off", name, v)
	}
	set(d)
	return nil
}

type engine struct {
	cfg  Config
	nc   *nats.Conn
	js   jetstream.JetStream
	log  zerolog.Logger
	deps *task.Deps

	// runners maps a Session id to its running Task, for routing
	// asynchronous publish failures.
	runners sync.Map

	toolsMu   sync.Mutex
	tools     []omni.ToolSpec
	toolsTime time.Time

	metrics *metrics
	running atomic.Int64 // Tasks running now
}

func (e *engine) loop(ctx context.Context, cons jetstream.Consumer) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, e.cfg.MaxTasks)
	for ctx.Err() == nil {
		free := e.cfg.MaxTasks - len(slots)
		if free == 0 {
			select {
			case slots <- struct{}{}:
				<-slots
			case <-ctx.Done():
			}
			continue
		}
		batch, err := cons.Fetch(free, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			e.log.Warn().Err(err).Msg("task fetch failed")
			_ = retry.Sleep(ctx, time.Second)
			continue
		}
		for msg := range batch.Messages() {
			slots <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				e.handle(ctx, msg)
			}()
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) {
			e.log.Warn().Err(err).Msg("task batch failed")
		}
	}
	return nil
}

func (e *engine) handle(ctx context.Context, msg jetstream.Msg) {
	var t omni.Task
	if err := omni.Unpack(msg.Data(), &t); err != nil || t.SessionID == "" || t.ID == "" {
		e.log.Error().Err(err).Str("subject", msg.Subject()).Msg("undecodable task dropped")
		_ = msg.Term()
		return
	}
	// Keep the Task ours while it runs.
	progress, stopProgress := context.WithCancel(ctx)
	defer stopProgress()
	go func() {
		tick := time.NewTicker(e.cfg.AckWait / 3)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				_ = msg.InProgress()
			case <-progress.Done():
				return
			}
		}
	}()
	runner := task.New(e.deps, t)
	e.runners.Store(t.SessionID, runner)
	e.metrics.tasks.Set(float64(e.running.Add(1)))
	sctx, span := e.startTask(ctx, msg, t)
	status, err := runner.Run(sctx)
	endTask(span, status, err)
	e.metrics.tasks.Set(float64(e.running.Add(-1)))
	if err == nil {
		e.metrics.outcomes.WithLabelValues(status).Inc()
	}
	e.runners.CompareAndDelete(t.SessionID, runner)
	stopProgress()
	switch {
	case errors.Is(err, task.ErrLeaseLost):
		// Another engine runs the Task now; its delivery is the live one.
		e.log.Warn().Str("session_id", t.SessionID).Str("task_id", t.ID).Msg("task taken over by another engine")
	case ctx.Err() != nil:
		// Shutting down: hand the Task to another engine at once.
		_ = msg.Nak()
	case err != nil && delivered(msg) >= maxStartAttempts:
		// Retried enough: fail it where the user sees it rather than keep
		// the Session running (and refusing new Tasks) for ever.
		e.log.Error().Err(err).Str("session_id", t.SessionID).Str("task_id", t.ID).Uint64("attempts", delivered(msg)).
			Msg("task could not be started; failed")
		e.failStart(ctx, t, err)
		_ = msg.Term()
	case err != nil:
		e.log.Error().Err(err).Str("session_id", t.SessionID).Msg("task could not run; will be redelivered")
		_ = msg.NakWithDelay(2 * time.Second)
	default:
		e.log.Info().Str("session_id", t.SessionID).Str("task_id", t.ID).Str("status", status).Msg("task finished")
		_ = msg.Ack()
		runner.NameSession(ctx, status)
	}
}

// maxStartAttempts is how many deliveries a Task that cannot be started
// gets (each 2 s after the last) before it is failed.
const maxStartAttempts = 5

func delivered(msg jetstream.Msg) uint64 {
	md, err := msg.Metadata()
	if err != nil {
		return 0
	}
	return md.NumDelivered
}

// failStart ends a Task that could not be started: the Session goes back
// to idle with status failed, and its stream says so (task_state idle,
// status failed, the reason).
func (e *engine) failStart(ctx context.Context, t omni.Task, cause error) {
	if err := e.deps.Sessions.End(ctx, t.SessionID, t.ID, omni.StatusFailed); err != nil {
		e.log.Error().Err(err).Str("session_id", t.SessionID).Msg("could not release the session of a task that failed to start")
		return
	}
	b, _ := json.Marshal(omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: omni.StatusFailed, TaskID: t.ID,
		Reason: fmt.Sprintf("the Task could not be started (%d attempts): %v", maxStartAttempts, cause)})
	nm := nats.NewMsg(omni.SessionSubject(t.SessionID, omni.ClassServer))
	nm.Data = b
	nm.Header.Set("Nats-Msg-Id", t.ID+"/start-failed")
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := e.deps.JS.PublishMsg(pctx, nm); err != nil {
		e.log.Warn().Err(err).AnErr("cause", cause).Str("session_id", t.SessionID).Msg("could not publish the failed task's end")
	}
}

// listTools asks the pool's runners for their tools. An answer without
// MCP servers is cached for a minute; with them every Task start asks
// again, so it reports the servers' current state.
func (e *engine) listTools(ctx context.Context) (omni.ToolList, error) {
	e.toolsMu.Lock()
	defer e.toolsMu.Unlock()
	if e.tools != nil && time.Since(e.toolsTime) < time.Minute {
		return omni.ToolList{Tools: e.tools}, nil
	}
	list, err := e.askTools(ctx, nil)
	if err == nil && len(list.Servers) == 0 && len(list.MCP) == 0 {
		e.tools, e.toolsTime = list.Tools, time.Now()
	}
	return list, err
}

// mcpServers names the pool's MCP servers; nothing is connected. A pool
// known (cached) to have none is not asked.
func (e *engine) mcpServers(ctx context.Context) ([]string, error) {
	e.toolsMu.Lock()
	cached := e.tools != nil && time.Since(e.toolsTime) < time.Minute
	e.toolsMu.Unlock()
	if cached {
		return nil, nil
	}
	body, err := omni.Pack(&omni.ToolListRequest{ServersOnly: true})
	if err != nil {
		return nil, err
	}
	list, err := e.askTools(ctx, body)
	return list.Servers, err
}

// askTools sends one tool list request to the pool, waiting for a runner
// to come up and, since a runner may be connecting its MCP servers, for
// its answer as long as the deadline allows (no runner at all fails each
// attempt at once).
func (e *engine) askTools(ctx context.Context, body []byte) (omni.ToolList, error) {
	deadline := time.Now().Add(e.deps.Settings.ToolListTimeout)
	return retry.Do(ctx, retry.Constant(200*time.Millisecond), 0, func() (omni.ToolList, error) {
		rctx, cancel := context.WithDeadline(ctx, deadline)
		reply, err := e.nc.RequestWithContext(rctx, omni.ToolListSubject(e.cfg.Pool), body)
		cancel()
		if err == nil {
			var list omni.ToolList
			if err := omni.Unpack(reply.Data, &list); err != nil {
				return omni.ToolList{}, retry.Permanent(fmt.Errorf("tool list: %w", err))
			}
			return list, nil
		}
		if ctx.Err() != nil {
			return omni.ToolList{}, retry.Permanent(ctx.Err())
		}
		if time.Now().After(deadline) {
			return omni.ToolList{}, retry.Permanent(fmt.Errorf("no tool runner answered on pool %q: %w", e.cfg.Pool, err))
		}
		return omni.ToolList{}, err
	}, nil)
}

// TaskConsumerConfig is the shared task consumer every engine replica
// pulls from; its ack wait is how long a dead engine's Task waits before
// another engine takes it over.
func TaskConsumerConfig(durable string, ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       durable,
		FilterSubject: "floe.task.>",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: -1,
		MaxDeliver:    -1,
	}
}

// taskConsumer opens the shared task consumer. Its settings belong to the
// layout (`floe setup`, or the first engine to start): an engine creates it
// when it is missing and otherwise never rewrites it. When the live ack
// wait disagrees with this engine's setting it says so and keeps to the
// live one (its progress acks and lease checks follow it).
func taskConsumer(ctx context.Context, js jetstream.JetStream, cfg *Config, log zerolog.Logger) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, omni.TasksStream, cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = js.CreateConsumer(ctx, omni.TasksStream, TaskConsumerConfig(cfg.Durable, cfg.AckWait))
		if errors.Is(err, jetstream.ErrConsumerExists) {
			cons, err = js.Consumer(ctx, omni.TasksStream, cfg.Durable) // another engine created it meanwhile
		}
	}
	if err != nil {
		return nil, fmt.Errorf("engine: task consumer: %w", err)
	}
	if live := cons.CachedInfo().Config.AckWait; live > 0 && live != cfg.AckWait {
		log.Warn().Dur("configured", cfg.AckWait).Dur("live", live).Str("consumer", cfg.Durable).
			Msg("the task consumer's ack wait differs from this engine's setting; keeping the live one (floe setup sets it)")
		cfg.AckWait = live
	}
	return cons, nil
}

// FromEnv returns DefaultConfig with the FLOE_* variables read through
// getenv over it (protocol.md §8): FLOE_HOME, FLOE_POOL, FLOE_HOOKS and the
// sandbox of hook commands (sandbox.ConfigFromEnv), the retry ladder, the
// timeouts, snapshots, partials and the provider variables. A value that does not parse is an error naming the variable.
//
// `floe engine`, the in-process engine of `floe serve`/`floe run` and the
// per-service main read the engine's settings here; their flags (Flags)
// then override it, and Validate checks the result the same way for all.
func FromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.Home = getenv("FLOE_HOME")
	if v := getenv("FLOE_POOL"); v != "" {
		c.Pool = v
	}
	c.Hooks.File = getenv("FLOE_HOOKS")
	// Hook commands run confined like tools, under the same variables.
	sb, err := sandbox.ConfigFromEnv(getenv)
	if err != nil {
		return c, fmt.Errorf("engine: %w", err)
	}
	c.Hooks.Sandbox = sb
	ms := func(name string, dst *time.Duration, min int) error {
		if v := getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < min {
				if min > 0 {
					return fmt.Errorf("%s=%q: want a positive number of milliseconds", name, v)
				}
				return fmt.Errorf("%s=%q: want milliseconds", name, v)
			}
			*dst = time.Duration(n) * time.Millisecond
		}
		return nil
	}
	// Deployments and fault tests tune the last two: how long a Task of a
	// dead engine waits before another engine takes it over, and how long
	// a running tool job may be silent before its call fails as lost.
	for _, v := range []struct {
		name string
		dst  *time.Duration
		min  int
	}{
		{"FLOE_RETRY_BASE_MS", &c.RetryBase, 0},
		{"FLOE_RETRY_CAP_MS", &c.RetryCap, 0},
		{"FLOE_REQUEST_TIMEOUT_MS", &c.RequestTimeout, 0},
		{"FLOE_ENGINE_ACK_WAIT_MS", &c.AckWait, 1},
		{"FLOE_HEARTBEAT_TIMEOUT_MS", &c.HeartbeatTimeout, 1},
	} {
		if err := ms(v.name, v.dst, v.min); err != nil {
			return c, err
		}
	}
	if v := getenv("FLOE_RETRY_MAX"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return c, fmt.Errorf("FLOE_RETRY_MAX=%q: want a count", v)
		}
		c.RetryMax = n
	}
	c.NoSnapshots = getenv("FLOE_SNAPSHOTS") == "off"
	for _, k := range []struct {
		name string
		set  func(time.Duration)
	}{{"FLOE_PARTIALS_KEEP", c.SetPartialsKeep}, {"FLOE_IDLE_KEEP", c.SetIdleKeep}} {
		if err := keepFromEnv(getenv(k.name), k.name, k.set); err != nil {
			return c, err
		}
	}
	c.Providers.OpenAIBaseURL = getenv("OPENAI_BASE_URL")
	c.Providers.OpenAIAPIKey = getenv("OPENAI_API_KEY")
	c.Providers.AnthropicBaseURL = getenv("ANTHROPIC_BASE_URL")
	c.Providers.AnthropicAPIKey = getenv("ANTHROPIC_API_KEY")
	return c, nil
}

// Flags registers the engine's own flags on fs, bound to c's fields with
// their current values (FromEnv's) as defaults, so a flag given beats its
// variable: --home (FLOE_HOME), --pool (FLOE_POOL), and --sandbox and
// --sandbox-network (FLOE_SANDBOX, FLOE_SANDBOX_NETWORK) for hook commands.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Home, "home", c.Home, "data root whose Traces the engine resumes from when shared with the tracer (FLOE_HOME)")
	fs.StringVar(&c.Pool, "pool", c.Pool, "tool runner pool the Sessions' tool jobs go to (FLOE_POOL)")
	c.Hooks.Sandbox.Flags(fs)
}

// ModelContext returns the model context a Session with these records
// resumes with: the deterministic fold the engine itself uses (only
// completed requests, tool outputs in call order, the last completed
// compaction's summary).
func ModelContext(records []omni.Message) []omni.Message {
	refs := fold.Load(records).Messages()
	out := make([]omni.Message, len(refs))
	for i, m := range refs {
		out[i] = *m
	}
	return out
}

// ResumeContext reads a Session's history the way an engine resuming it
// does (trace.Replay folded as it is read) and returns the model context
// it resumes with, the sequence of the last message read and the count of
// records skipped as undecodable.
func ResumeContext(ctx context.Context, js jetstream.JetStream, home, sessionID string) (msgs []*omni.Message, lastSeq uint64, bad int, err error) {
	fc := fold.New()
	lastSeq, bad, err = trace.Replay(ctx, js, home, sessionID, fc.Apply, fc.Reset)
	if err != nil {
		return nil, 0, 0, err
	}
	return fc.Messages(), lastSeq, bad, nil
}
