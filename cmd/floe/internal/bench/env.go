package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/engine"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

// env is one fresh Floe in this process: an embedded nats-server (in-process
// connections only) on a store under its own FLOE_HOME and, with services,
// the engine, one toolrunner, the tracer and the gateway, the gateway served
// on a loopback listener. Each scenario gets its own env, so streams, caches
// and memory figures of one scenario never leak into another.
type env struct {
	home    string
	st      *stack.Stack
	natsURL string              // "" when st embeds the server
	nc      *nats.Conn          // the benchmark's own publisher connection
	js      jetstream.JetStream // on nc, async publish window 4096 like the engine's

	gwConn  *nats.Conn
	release func()
	hs      *http.Server
	served  chan error
	addr    string // gateway host:port
	api     *client.Client
	tel     *telemetry.Provider // the gateway's, from OTEL_* at start (nil: off)
}

// startEnv starts an env under root/name; services adds engine, toolrunner,
// tracer and gateway.
func startEnv(ctx context.Context, root, name string, services bool, log zerolog.Logger) (*env, error) {
	return startEnvOn(ctx, root, name, services, "", log)
}

// startEnvOn is startEnv on the nats-server at natsURL, over TCP (""
// embeds one in this process).
func startEnvOn(ctx context.Context, root, name string, services bool, natsURL string, log zerolog.Logger) (*env, error) {
	return startEnvTuned(ctx, root, name, services, natsURL, nil, log)
}

// startEnvTuned is startEnvOn with the stack's options changed by tune
// (when not nil) after the services' defaults: an engine setting, or a
// service left out (a nil config).
func startEnvTuned(ctx context.Context, root, name string, services bool, natsURL string, tune func(*stack.Options), log zerolog.Logger) (*env, error) {
	home := filepath.Join(root, name)
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, fmt.Errorf("bench: home: %w", err)
	}
	opts := stack.Options{Home: home, Listen: "off", NatsURL: natsURL, Bus: bus.Config{}}
	if services {
		eng := engine.DefaultConfig()
		eng.Home, eng.NoSnapshots = home, os.Getenv("FLOE_SNAPSHOTS") == "off"
		tr := tracer.DefaultConfig()
		tr.Home = home
		tools := toolrunner.Config{RunnerID: "bench-runner"}
		opts.Engine, opts.Tracer, opts.Toolrunner = &eng, &tr, &tools
	}
	if tune != nil {
		tune(&opts)
	}
	st, err := stack.Start(ctx, opts, log)
	if err != nil {
		return nil, fmt.Errorf("bench: start stack: %w", err)
	}
	e := &env{home: home, st: st, natsURL: natsURL}
	if e.nc, err = e.connect("floe-bench"); err != nil {
		e.stop()
		return nil, err
	}
	if e.js, err = jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		e.stop()
		return nil, err
	}
	if !services {
		return e, nil
	}
	if e.gwConn, err = e.connect("floe-gateway"); err != nil {
		e.stop()
		return nil, err
	}
	if e.tel, err = telemetry.FromEnv(ctx, "floe-gateway", os.Getenv); err != nil {
		e.stop()
		return nil, err
	}
	h, release, err := gateway.NewHandler(ctx, e.gwConn, gateway.Config{Home: home, ScriptsDir: home, DetachSSE: true, Telemetry: e.tel}, log)
	if err != nil {
		e.stop()
		return nil, fmt.Errorf("bench: gateway: %w", err)
	}
	e.release = release
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.stop()
		return nil, fmt.Errorf("bench: listen: %w", err)
	}
	e.addr = ln.Addr().String()
	e.hs = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	e.served = make(chan error, 1)
	go func() { e.served <- e.hs.Serve(ln) }()
	e.api = client.New("http://"+e.addr, client.WithHTTPClient(&http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
	}))
	return e, nil
}

// connect opens a connection of the benchmark's own: in-process to an
// embedded server, else over TCP.
func (e *env) connect(name string) (*nats.Conn, error) {
	if e.st.Server != nil {
		return e.st.Server.Connect(nats.Name(name))
	}
	return nats.Connect(e.natsURL, nats.Name(name), nats.ReconnectBufSize(-1))
}

// flushTelemetry exports what the gateway traced so far (the services'
// providers flush when the stack stops).
func (e *env) flushTelemetry(ctx context.Context) {
	_ = e.tel.ForceFlush(ctx)
}

// stop shuts the env down (gateway streams, HTTP server, services,
// connections, server) and removes its home.
func (e *env) stop() {
	defer func() { _ = e.tel.Shutdown(context.Background()) }()
	if e.release != nil {
		e.release()
	}
	if e.hs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := e.hs.Shutdown(ctx); err != nil {
			e.hs.Close()
		}
		cancel()
		if err := <-e.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "bench: gateway serve: %v\n", err)
		}
	}
	if e.gwConn != nil {
		e.gwConn.Close()
	}
	if e.nc != nil {
		e.nc.Close()
	}
	if e.st != nil {
		e.st.Stop()
	}
	_ = os.RemoveAll(e.home)
}

// publishAsync publishes m without waiting for its ack; when the window of
// unacknowledged publishes is full it waits for the acks (bounded), as a
// producer must.
func (e *env) publishAsync(ctx context.Context, m *nats.Msg) error {
	for {
		_, err := e.js.PublishMsgAsync(m)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return fmt.Errorf("bench: publish %s: %w", m.Subject, err)
		}
		select {
		case <-e.js.PublishAsyncComplete():
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Second):
			return errors.New("bench: publish acks missing for 30s")
		}
	}
}

// flush waits until every async publish is acknowledged.
func (e *env) flush(ctx context.Context) error {
	select {
	case <-e.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(60 * time.Second):
		return errors.New("bench: publish acks missing for 60s")
	}
}
