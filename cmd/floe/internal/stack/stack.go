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
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/embed"
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

	Engine     *engine.Config
	Toolrunner *toolrunner.Config
	Tracer     *tracer.Config
	Gateway    *gateway.Config
}

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
	conns  []*nats.Conn
}

// Start brings the stack up. Services run until Stop.
func Start(ctx context.Context, o Options, log zerolog.Logger) (*Stack, error) {
	s := &Stack{}
	connect := func(name string) (*nats.Conn, error) {
		opts := []nats.Option{nats.Name("floe-" + name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
		var nc *nats.Conn
		var err error
		if s.Server != nil {
			nc, err = s.Server.Connect(opts...)
		} else {
			nc, err = nats.Connect(o.NatsURL, opts...)
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
		srv, err := embed.Start(embed.Options{StoreDir: store, Listen: o.Listen})
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
	setupCtx, cancelSetup := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSetup()
	if s.Sessions, err = bus.Setup(setupCtx, s.JS, o.Bus); err != nil {
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
				s.mu.Unlock()
			}
		}()
		return nil
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

// Err returns the errors of services that stopped on their own.
func (s *Stack) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// Stop stops the services, waits for them, flushes and closes connections,
// and shuts the embedded server down last.
func (s *Stack) Stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	for _, c := range s.conns {
		_ = c.Drain()
	}
	for _, c := range s.conns {
		for c.IsDraining() {
			time.Sleep(5 * time.Millisecond)
		}
		c.Close()
	}
	if s.Server != nil {
		s.Server.Shutdown()
	}
}
