// Package runner is the toolrunner's consume loop: it pulls tool jobs from
// the pool's shared FLOE_TOOLS consumer while it has free slots, executes
// each at most once through a tools.Registry, streams the output onto the
// Session's subjects, reports running jobs in heartbeats, stops jobs on
// cancel requests and serves the tool list.
//
// # Goroutines
//
// Run starts and waits for: the fetch loop (Run's own goroutine), one
// goroutine per fetched job, one flusher per running job (owned by its job
// goroutine) and its producer's goroutine (pkg/bus/publish, closed before
// the job goroutine ends), the heartbeat loop, the cancel loop and its reply waiters, and
// the tool list loop. Subscriptions are channel subscriptions, so no NATS
// goroutine ever calls into this package.
//
// # Lock order
//
// runner.mu before job.mu; nothing takes runner.mu while holding job.mu.
package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/toolrunner/internal/tools"
)

// Defaults of Config's tuning fields.
const (
	DefaultFetchWait  = time.Second
	DefaultFlushBytes = 8 << 10
	DefaultFlushDelay = 25 * time.Millisecond
)

// Internal bounds.
const (
	ackTimeout     = 5 * time.Second  // one DoubleAck round trip
	publishTimeout = 5 * time.Second  // one attempt of a synchronous publish
	publishBudget  = 30 * time.Second // all attempts of a complete output
	cancelWait     = 5 * time.Second  // a cancelled job's goroutine to exit
	flushTimeout   = 5 * time.Second  // final flush at shutdown
	maxBackoff     = 5 * time.Second
	maxAckPending  = 4096
	ackWait        = 30 * time.Second
	queueGroup     = "floe-toolrunner"
	cancelBuffer   = 1024 // cancel requests waiting for the cancel loop
	listBuffer     = 256  // tool list requests waiting for the list loop
)

// errShutdown is the cancel cause of jobs still running when the shutdown
// grace period ends; the tools package writes it into the output note.
var errShutdown = errors.New("toolrunner shutting down")

// errCancelled is the cancel cause of jobs the engine cancelled.
var errCancelled = errors.New("tool call cancelled")

// ToolListSubject returns floe.toollist.<pool>.
func ToolListSubject(pool string) string { return omni.ToolListSubject(pool) }

// ConsumerName returns the durable consumer shared by a pool's runners.
func ConsumerName(pool string) string { return "floe-toolrunner-" + pool }

// Config is a validated runner configuration (the root package checks it).
type Config struct {
	Pool              string
	Concurrency       int
	RunnerID          string
	HeartbeatInterval time.Duration
	ShutdownGrace     time.Duration
	Tools             Toolbox
	// Telemetry traces each job as an execute_tool span (nil: off).
	Telemetry *telemetry.Provider
	// Sandbox is reported in tool list replies (nil: not reported).
	Sandbox *omni.SandboxInfo

	// Tuning; zero takes the default.
	FetchWait  time.Duration // longest wait of one pull request
	FlushBytes int           // flush a delta once this much output is buffered
	FlushDelay time.Duration // flush a delta this long after its first byte
}

func (c *Config) defaults() {
	if c.FetchWait <= 0 {
		c.FetchWait = DefaultFetchWait
	}
	if c.FlushBytes <= 0 {
		c.FlushBytes = DefaultFlushBytes
	}
	if c.FlushDelay <= 0 {
		c.FlushDelay = DefaultFlushDelay
	}
}

// Toolbox is the set of tools a runner offers and executes.
type Toolbox interface {
	// List returns the tools and, when MCP servers are configured, how
	// each connected; it may connect servers, bounded by ctx.
	List(ctx context.Context) ([]omni.ToolSpec, []omni.MCPConnectResult)
	// Servers names the configured MCP servers, connecting nothing.
	Servers() []string
	// Execute runs one call; see tools.Registry.Execute.
	Execute(ctx context.Context, call tools.Call, emit tools.Emit) tools.Result
}

type runner struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	// pubJS is what the jobs' publish.Publishers use: a connection
	// without reconnect buffer (bus.PublishJS).
	pubJS jetstream.JetStream
	log   zerolog.Logger

	slots chan struct{} // one token per running (or starting) job
	jobs  sync.WaitGroup
	wg    sync.WaitGroup // everything else: loops and cancel waiters

	mu        sync.Mutex         // guards active, holding and cancelled
	active    map[string]*job    // running jobs by jobKey; a cancelled job leaves at once
	holding   map[string]heldJob // fetched jobs whose ack is being confirmed, by jobKey
	cancelled *cancelMemory
}

// Run executes jobs until ctx ends; see the root package's Run.
func Run(ctx context.Context, nc *nats.Conn, cfg Config, log zerolog.Logger) error {
	cfg.defaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("toolrunner: jetstream: %w", err)
	}
	pubJS, closePub, err := bus.PublishJS(nc)
	if err != nil {
		return fmt.Errorf("toolrunner: %w", err)
	}
	defer closePub()
	r := &runner{
		cfg:       cfg,
		nc:        nc,
		js:        js,
		pubJS:     pubJS,
		log:       log.With().Str("runner", cfg.RunnerID).Str("pool", cfg.Pool).Logger(),
		slots:     make(chan struct{}, cfg.Concurrency),
		active:    make(map[string]*job),
		holding:   make(map[string]heldJob),
		cancelled: newCancelMemory(cancelTTL, cancelMax),
	}
	// Jobs outlive ctx by the shutdown grace period; drainJobs ends them.
	jobsCtx, cancelJobs := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelJobs(nil)

	cons, err := r.consumer(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	// Subscribe before fetching: a cancel for a job must be heard before
	// that job can start.
	cancelCh := make(chan *nats.Msg, cancelBuffer)
	cancelSub, err := nc.ChanSubscribe(omni.CancelSubject("*"), cancelCh)
	if err != nil {
		return fmt.Errorf("toolrunner: subscribe %s: %w", omni.CancelSubject("*"), err)
	}
	defer cancelSub.Unsubscribe()
	listCh := make(chan *nats.Msg, listBuffer)
	listSub, err := nc.ChanQueueSubscribe(ToolListSubject(cfg.Pool), queueGroup, listCh)
	if err != nil {
		return fmt.Errorf("toolrunner: subscribe %s: %w", ToolListSubject(cfg.Pool), err)
	}
	defer listSub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("toolrunner: register subscriptions: %w", err)
	}

	stopCancel, stopList, stopBeat := make(chan struct{}), make(chan struct{}), make(chan struct{})
	r.goLoop(func() { r.cancelLoop(cancelCh, stopCancel) })
	r.goLoop(func() { r.listLoop(listCh, stopList) })
	r.goLoop(func() { r.heartbeatLoop(stopBeat) })
	r.log.Info().Int("concurrency", cfg.Concurrency).Msg("toolrunner started")

	runErr := r.fetchLoop(ctx, jobsCtx, cons)

	// Shutdown: intake first, then running jobs within the grace period,
	// then the loops that serve them, then the publishes.
	_ = listSub.Unsubscribe()
	close(stopList)
	r.drainJobs(cancelJobs)
	_ = cancelSub.Unsubscribe()
	close(stopCancel)
	close(stopBeat)
	r.wg.Wait()
	r.flush()
	r.log.Info().Msg("toolrunner stopped")
	return runErr
}

func (r *runner) goLoop(f func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// consumer creates or joins the pool's shared consumer, waiting for the
// FLOE_TOOLS stream to appear. It fails only when ctx ends.
func (r *runner) consumer(ctx context.Context) (jetstream.Consumer, error) {
	cc := jetstream.ConsumerConfig{
		Durable:       ConsumerName(r.cfg.Pool),
		Description:   "Floe tool runners of pool " + r.cfg.Pool,
		FilterSubject: omni.ToolSubject(r.cfg.Pool, ">"),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	attempt := 0
	return retry.Do(ctx, retry.Exponential(100*time.Millisecond, maxBackoff), 0, func() (jetstream.Consumer, error) {
		cons, err := r.js.CreateOrUpdateConsumer(ctx, omni.ToolsStream, cc)
		if err != nil && attempt%20 == 0 {
			r.log.Warn().Err(err).Str("stream", omni.ToolsStream).Msg("cannot create tool job consumer; retrying")
		}
		attempt++
		return cons, err
	}, nil)
}

// fetchLoop pulls jobs while ctx lasts, never more than the free slots, and
// runs each under jobsCtx. It returns nil when ctx ends, an error when the
// connection is closed.
func (r *runner) fetchLoop(ctx, jobsCtx context.Context, cons jetstream.Consumer) error {
	backoff := retry.Exponential(100*time.Millisecond, maxBackoff)
	for {
		// Reserve every free slot, waiting for at least one.
		select {
		case r.slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		reserved := 1
	reserve:
		for reserved < cap(r.slots) {
			select {
			case r.slots <- struct{}{}:
				reserved++
			default:
				break reserve
			}
		}

		batch, err := cons.Fetch(reserved, jetstream.FetchMaxWait(r.cfg.FetchWait))
		if err == nil {
			for m := range batch.Messages() {
				reserved--
				if ctx.Err() != nil {
					// Not acked, so not started: hand it back at once.
					if err := m.Nak(); err != nil {
						r.log.Warn().Err(err).Str("subject", m.Subject()).Msg("nak on shutdown failed; job redelivered after ack wait")
					}
					<-r.slots
					continue
				}
				r.jobs.Add(1)
				go func() {
					defer r.jobs.Done()
					defer func() { <-r.slots }()
					r.process(jobsCtx, m)
				}()
			}
			err = batch.Error()
		}
		for ; reserved > 0; reserved-- {
			<-r.slots
		}
		switch {
		case err == nil:
			backoff.Reset()
			continue
		case r.nc.IsClosed():
			return fmt.Errorf("toolrunner: fetch jobs: %w", nats.ErrConnectionClosed)
		case ctx.Err() != nil:
			return nil
		}
		wait := backoff.NextBackOff()
		r.log.Warn().Err(err).Dur("backoff", wait).Msg("fetch tool jobs failed")
		if retry.Sleep(ctx, wait) != nil {
			return nil
		}
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) {
			c, err := r.consumer(ctx)
			if err != nil {
				return nil // ctx ended
			}
			cons = c
		}
	}
}

// drainJobs waits for running jobs, cancelling them (cancelJobs) once the
// grace period has passed.
func (r *runner) drainJobs(cancelJobs context.CancelCauseFunc) {
	idle := make(chan struct{})
	go func() {
		r.jobs.Wait()
		close(idle)
	}()
	grace := time.NewTimer(r.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-idle:
		return
	case <-grace.C:
	}
	r.mu.Lock()
	n := len(r.active)
	r.mu.Unlock()
	r.log.Warn().Int("jobs", n).Dur("grace", r.cfg.ShutdownGrace).Msg("cancelling jobs still running at shutdown")
	cancelJobs(errShutdown)
	<-idle
}

// flush waits, bounded, until every publish has reached the server (each
// job's producer committed its messages before the job ended; heartbeats
// and replies are core NATS).
func (r *runner) flush() {
	if err := r.nc.FlushTimeout(flushTimeout); err != nil && !r.nc.IsClosed() {
		r.log.Warn().Err(err).Msg("flush at shutdown failed")
	}
}
