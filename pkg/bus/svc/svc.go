// Package svc holds what every service main shares: the NATS and logging
// flags, credentials (a password never from a flag), connecting, waiting
// for the JetStream layout an admin creates, and a bounded drain on exit.
package svc

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/ops"
	"floe.dev/pkg/bus/retry"
)

// EnvOr returns the variable's value, or def when it is unset or empty.
func EnvOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// AuthOptions turns the credentials settings into connect options; the
// password comes from FLOE_NATS_PASSWORD or passwordFile, never a flag.
func AuthOptions(creds, user, passwordFile string) ([]nats.Option, error) {
	var opts []nats.Option
	if creds != "" {
		if _, err := os.Stat(creds); err != nil {
			return nil, fmt.Errorf("nats credentials: %w", err)
		}
		opts = append(opts, nats.UserCredentials(creds))
	}
	password := os.Getenv("FLOE_NATS_PASSWORD")
	if passwordFile != "" {
		b, err := os.ReadFile(passwordFile)
		if err != nil {
			return nil, fmt.Errorf("nats password file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	switch {
	case user != "" && creds != "":
		return nil, errors.New("give either --nats-creds or --nats-user, not both")
	case user != "" && password == "":
		return nil, fmt.Errorf("nats user %q has no password: set FLOE_NATS_PASSWORD or --nats-password-file", user)
	case user == "" && password != "":
		return nil, errors.New("a NATS password is set but no user: set FLOE_NATS_USER or --nats-user")
	case user != "":
		opts = append(opts, nats.UserInfo(user, password))
	}
	return opts, nil
}

// WaitLayout waits until the JetStream layout exists or ctx ends; waiting
// is called once with the first error, so the caller can say why it waits.
func WaitLayout(ctx context.Context, nc *nats.Conn, waiting func(error)) {
	js, err := jetstream.New(nc)
	if err != nil {
		return // only fails on invalid options; Run reports the same
	}
	first := true
	_, _ = retry.Do(ctx, retry.Constant(time.Second), 0, func() (struct{}, error) {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := bus.Open(octx, js)
		cancel()
		if err != nil && first && waiting != nil {
			waiting(err)
		}
		first = false
		return struct{}{}, err
	}, nil)
}

// Close flushes what is still buffered (at most 10 s) and closes nc.
func Close(nc *nats.Conn) {
	_ = nc.Drain()
	deadline := time.Now().Add(10 * time.Second)
	for nc.IsDraining() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	nc.Close()
}

// Main is what every service main shares: the NATS and logging flags, the
// signal context, the connection (named floe-<service>, replies on
// _INBOX.<service>), and waiting for the layout before the service runs.
type Main struct {
	service                        string
	url, creds, user, passwordFile string
	level                          string
	metricsAddr                    string
	reg                            *prometheus.Registry
}

// NewMain registers the shared flags of service on fs.
func NewMain(service string, fs *flag.FlagSet) *Main {
	m := &Main{service: service}
	fs.StringVar(&m.url, "nats", os.Getenv("FLOE_NATS_URL"), "NATS URL(s), comma-separated (FLOE_NATS_URL)")
	fs.StringVar(&m.creds, "nats-creds", os.Getenv("FLOE_NATS_CREDS"), "NATS credentials file (FLOE_NATS_CREDS)")
	fs.StringVar(&m.user, "nats-user", os.Getenv("FLOE_NATS_USER"), "NATS user (FLOE_NATS_USER); password from FLOE_NATS_PASSWORD or --nats-password-file")
	fs.StringVar(&m.passwordFile, "nats-password-file", os.Getenv("FLOE_NATS_PASSWORD_FILE"), "file holding the NATS password (FLOE_NATS_PASSWORD_FILE)")
	fs.StringVar(&m.level, "log-level", EnvOr("FLOE_LOG_LEVEL", "info"), "debug, info, warn or error (FLOE_LOG_LEVEL)")
	fs.StringVar(&m.metricsAddr, "metrics", os.Getenv("FLOE_METRICS_ADDR"), "serve Prometheus metrics on http://ADDR/metrics (FLOE_METRICS_ADDR)")
	m.reg = ops.NewRegistry()
	return m
}

// Metrics is the registry the service's series go to (its Config's
// Metrics), served on --metrics ADDR when set.
func (m *Main) Metrics() *prometheus.Registry { return m.reg }

// Run connects and runs the service until SIGINT or SIGTERM. Call it after
// the flags are parsed and the service's Config is built and valid.
func (m *Main) Run(run func(ctx context.Context, nc *nats.Conn, log zerolog.Logger) error) error {
	if m.url == "" {
		return errors.New("--nats (or FLOE_NATS_URL) is required")
	}
	lvl, err := zerolog.ParseLevel(m.level)
	if err != nil {
		return fmt.Errorf("--log-level %q: %w", m.level, err)
	}
	log := zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Logger()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts, err := AuthOptions(m.creds, m.user, m.passwordFile)
	if err != nil {
		return err
	}
	opts = append(opts, nats.CustomInboxPrefix("_INBOX."+m.service))
	nc, err := nats.Connect(m.url, append(opts, bus.ClientOptions(m.service)...)...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", m.url, err)
	}
	defer Close(nc)
	WaitLayout(ctx, nc, func(err error) {
		log.Warn().Err(err).Str("service", m.service).Msg("waiting for the bus layout; run `floe setup`")
	})
	if ctx.Err() != nil {
		return nil
	}
	if m.metricsAddr != "" {
		served := make(chan struct{})
		defer func() { <-served }()
		mctx, stopMetrics := context.WithCancel(ctx)
		defer stopMetrics()
		go func() {
			defer close(served)
			if err := ops.ServeMetrics(mctx, m.metricsAddr, m.reg); err != nil {
				log.Error().Err(err).Str("service", m.service).Str("addr", m.metricsAddr).Msg("metrics not served")
			}
		}()
	}
	if err := run(ctx, nc, log); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
