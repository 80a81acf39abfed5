// Package stack wires Floe's services into one process: an embedded
// nats-server (or an external NATS), the JetStream layout, and any subset of
// engine, toolrunner, tracer and gateway, each on its own connection.
package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/bus/ops"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/engine"
	"floe.dev/services/gateway"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

// Options selects the bus and the services.
type Options struct {
	Home    string // $FLOE_HOME
	NatsURL string // external NATS; "" = embedded
	Listen  string // embedded client listener ("off", host:port)
	Bus     bus.Config

	// Connect holds extra options for every connection to an external NATS
	// (credentials).
	Connect []nats.Option
	// InboxPrefix, when set, is the reply-subject prefix of every
	// connection (e.g. "_INBOX.engine"), so a per-service NATS user can be
	// allowed to subscribe to its own replies only.
	InboxPrefix string
	// OpenNATS serves the embedded server's listener without
	// authentication (FLOE_NATS_AUTH=off); refused unless the listener is
	// loopback. Otherwise a listening embedded server requires the users
	// of CredentialsDir(Home), generated on first start, and every
	// in-process service connects as its own least-privilege role.
	OpenNATS bool
	// NoSetup waits for an existing layout (made by `floe setup` or another
	// process) instead of creating or updating it: a least-privilege NATS
	// user may not manage streams.
	NoSetup bool

	Engine     *engine.Config
	Toolrunner *toolrunner.Config
	Tracer     *tracer.Config
	Gateway    *gateway.Config

	// MetricsAddr, when set, serves every service's series on
	// http://MetricsAddr/metrics; the gateway serves them on its own port
	// too. One registry holds every service of the stack.
	MetricsAddr string
}

// CredentialsDir is where a listening embedded server keeps its users'
// passwords (0600) and the nats CLI contexts `floe serve` writes: home/nats.
func CredentialsDir(home string) string { return filepath.Join(home, "nats") }

// Stack is a running set of services.
type Stack struct {
	Server   *embed.Server // nil with an external NATS
	Conn     *nats.Conn    // the stack's own connection
	JS       jetstream.JetStream
	Sessions *bus.Sessions

	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
	failed chan struct{} // closed when the first service stops on its own
	conns  []*nats.Conn
	tel    []*telemetry.Provider // the services' OpenTelemetry, flushed at stop
}

// Start brings the stack up. Services run until Stop.
func Start(ctx context.Context, o Options, log zerolog.Logger) (*Stack, error) {
	s := &Stack{failed: make(chan struct{})}
	connect := func(name string) (*nats.Conn, error) {
		opts := bus.ClientOptions(name)
		var nc *nats.Conn
		var err error
		if o.InboxPrefix != "" {
			opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
		}
		switch {
		case s.Server != nil && s.Server.Authenticated() && name != "stack":
			nc, err = s.Server.ConnectAs(name, opts...)
		case s.Server != nil:
			nc, err = s.Server.Connect(opts...)
		default:
			nc, err = nats.Connect(o.NatsURL, append(opts, o.Connect...)...)
		}
		if err == nil {
			s.conns = append(s.conns, nc)
		}
		return nc, err
	}
	if o.NatsURL == "" {
		store := filepath.Join(o.Home, "jetstream")
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, fmt.Errorf("stack: %w", err)
		}
		eo := embed.Options{StoreDir: store, Listen: o.Listen}
		if o.Listen != "" && o.Listen != "off" && !o.OpenNATS {
			creds, err := embed.LoadCredentials(CredentialsDir(o.Home))
			if err != nil {
				return nil, fmt.Errorf("stack: %w", err)
			}
			eo.Credentials = creds
		}
		srv, err := embed.Start(eo)
		if err != nil {
			return nil, err
		}
		s.Server = srv
	}
	nc, err := connect("stack")
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("stack: connect: %w", err)
	}
	s.Conn = nc
	if s.JS, err = jetstream.New(nc); err != nil {
		s.Stop()
		return nil, err
	}
	if o.NoSetup {
		s.Sessions, err = waitLayout(ctx, s.JS, log)
	} else {
		setupCtx, cancelSetup := context.WithTimeout(ctx, 30*time.Second)
		// Create what is missing; settings of an existing layout belong to
		// floe setup (or the first start) and are only reported.
		var diffs []string
		s.Sessions, diffs, err = bus.Ensure(setupCtx, s.JS, keepReplicas(setupCtx, s.JS, o.Bus))
		cancelSetup()
		for _, d := range diffs {
			log.Warn().Msg(d)
		}
	}
	if err != nil {
		s.Stop()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	start := func(name string, run func(context.Context, *nats.Conn) error) error {
		c, err := connect(name)
		if err != nil {
			return fmt.Errorf("stack: connect %s: %w", name, err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := run(runCtx, c); err != nil && !errors.Is(err, context.Canceled) {
				log.Error().Err(err).Str("service", name).Msg("service stopped")
				s.mu.Lock()
				s.errs = append(s.errs, fmt.Errorf("%s: %w", name, err))
				if len(s.errs) == 1 {
					close(s.failed)
				}
				s.mu.Unlock()
			}
		}()
		return nil
	}
	reg := ops.NewRegistry()
	// Each service traces under its own name, when OTEL_* asks for it.
	tel := func(service string) *telemetry.Provider {
		p, err := telemetry.FromEnv(ctx, "floe-"+service, os.Getenv)
		if err != nil {
			log.Error().Err(err).Str("service", service).Msg("OpenTelemetry not exported")
			return nil
		}
		if telemetry.Enabled(p) {
			s.tel = append(s.tel, p)
		}
		return p
	}
	// Close this stack's own listeners to tools and hook commands: the
	// embedded server's (its port may have been chosen at start), metrics
	// and the gateway.
	own := []string{o.MetricsAddr, o.Listen}
	if s.Server != nil {
		own = append(own, s.Server.ClientURL())
	}
	if o.Gateway != nil {
		own = append(own, o.Gateway.Addr)
	}
	if o.Engine != nil {
		c := *o.Engine
		c.Metrics, c.Telemetry, o.Engine = reg, tel("engine"), &c
		c.Hooks.Sandbox.DenyPorts = slices.Clone(c.Hooks.Sandbox.DenyPorts)
		c.Hooks.Sandbox.DenyAddrs(own...)
	}
	if o.Toolrunner != nil {
		c := *o.Toolrunner
		c.Metrics, c.Telemetry, o.Toolrunner = reg, tel("toolrunner"), &c
		c.Sandbox.DenyPorts = slices.Clone(c.Sandbox.DenyPorts)
		c.Sandbox.DenyAddrs(own...)
	}
	if o.Tracer != nil {
		c := *o.Tracer
		c.Metrics, o.Tracer = reg, &c
	}
	if o.Gateway != nil {
		c := *o.Gateway
		c.Metrics, c.Gatherer, c.Telemetry, o.Gateway = reg, reg, tel("gateway"), &c
	}
	if len(s.tel) > 0 {
		log.Info().Msg("OpenTelemetry export on (OTEL_EXPORTER_OTLP_ENDPOINT)")
	}
	if o.MetricsAddr != "" {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := ops.ServeMetrics(runCtx, o.MetricsAddr, reg); err != nil {
				log.Error().Err(err).Str("addr", o.MetricsAddr).Msg("metrics not served")
			}
		}()
	}
	var errs []error
	if o.Tracer != nil {
		errs = append(errs, start("tracer", func(ctx context.Context, c *nats.Conn) error { return tracer.Run(ctx, c, *o.Tracer, log) }))
	}
	if o.Toolrunner != nil {
		errs = append(errs, start("toolrunner", func(ctx context.Context, c *nats.Conn) error { return toolrunner.Run(ctx, c, *o.Toolrunner, log) }))
	}
	if o.Engine != nil {
		errs = append(errs, start("engine", func(ctx context.Context, c *nats.Conn) error { return engine.Run(ctx, c, *o.Engine, log) }))
	}
	if o.Gateway != nil {
		errs = append(errs, start("gateway", func(ctx context.Context, c *nats.Conn) error { return gateway.Run(ctx, c, *o.Gateway, log) }))
	}
	if err := errors.Join(errs...); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Failed is closed when a service stops on its own with an error (a
// gateway that cannot listen, say): the stack is no longer whole, and a
// command serving it should stop and report Err.
func (s *Stack) Failed() <-chan struct{} { return s.failed }

// Err returns the errors of services that stopped on their own.
func (s *Stack) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// Stop stops the services, waits for them, flushes and closes connections,
// and shuts the embedded server down last.
func (s *Stack) Stop() { s.stop(0) }

// StopIdle is Stop for a stack with no work left (a terminal command
// whose Task has ended and been traced): services still waiting out a
// pull request's timeout after a short grace are not waited for, so the
// command exits without an idle second. The connections are drained and
// the embedded server shut down as in Stop, so nothing stored is lost.
func (s *Stack) StopIdle() { s.stop(idleGrace) }

// idleGrace is how long StopIdle waits for the services to return.
const idleGrace = 200 * time.Millisecond

// stop stops the services, waiting for them up to grace (0: until they
// return), then drains and closes the connections.
func (s *Stack) stop(grace time.Duration) {
	if s.cancel != nil {
		s.cancel()
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	if grace > 0 {
		select {
		case <-done:
		case <-time.After(grace):
		}
	} else {
		<-done
	}
	// What the services traced goes out before the process does.
	for _, p := range s.tel {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = p.Shutdown(ctx)
		cancel()
	}
	for _, c := range s.conns {
		_ = c.Drain()
	}
	drainUntil := time.Now().Add(5 * time.Second) // StopIdle only
	for _, c := range s.conns {
		for c.IsDraining() && (grace == 0 || time.Now().Before(drainUntil)) {
			time.Sleep(5 * time.Millisecond)
		}
		c.Close()
	}
	if s.Server != nil {
		s.Server.Shutdown()
	}
}

// keepReplicas returns c with the replicas of the existing FLOE_SESSIONS
// stream when c leaves them unset, so a service started without
// FLOE_REPLICAS on a cluster never scales an R3 layout down to one replica.
func keepReplicas(ctx context.Context, js jetstream.JetStream, c bus.Config) bus.Config {
	if c.Replicas > 0 {
		return c
	}
	if st, err := js.Stream(ctx, omni.SessionsStream); err == nil {
		c.Replicas = st.CachedInfo().Config.Replicas
	}
	return c
}

// waitLayout waits until the bus layout exists and opens it; it fails only
// when ctx ends.
func waitLayout(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) (*bus.Sessions, error) {
	for attempt := 0; ; attempt++ {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		sessions, err := bus.Open(octx, js)
		cancel()
		if err == nil {
			return sessions, nil
		}
		if attempt == 0 {
			log.Warn().Err(err).Msg("waiting for the bus layout; run `floe setup` with a NATS user that may manage streams")
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stack: waiting for the bus layout: %w", err)
		case <-time.After(time.Second):
		}
	}
}
