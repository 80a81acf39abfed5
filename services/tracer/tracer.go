// Package tracer is Floe's tracer service: it writes every Session's Trace
// (protocol.md §5), the append-only JSONL files that the history API and resume
// read, from the FLOE_SESSIONS stream.
//
// A durable pull consumer reads the Trace classes of every Session
// (floe.session.*.meta|model|event|trace): filtered to them once caught
// up, so partials, nested and server events never reach it, and the
// whole stream while far behind, where a filtered catch-up costs
// nats-server more than dropping the other classes here
// (internal/consume). Each message body, one OmniMessage as single-line
// JSON, is appended verbatim with its newline to
// $Home/traces/<yyyy-mm-dd>/<sid>_<nnn>.jsonl; a session_meta starts the
// next file when the current one holds records (a completed compaction).
// Bodies that do not decode or validate, partials and origin-tagged
// messages are skipped with a log line and acknowledged.
//
// Records are written exactly once across restarts and crashes: per Session
// a position file, $Home/tracer/<sid>.pos (trace.Pos: the stream
// sequence of the last record written, its file and that file's size), is
// rewritten after the records and before they are acknowledged. On resume
// the file is truncated back to the recorded size and redelivered records
// at or below the recorded sequence are skipped. Readers use the same
// position to join the Trace and the stream (history = the Trace up to the
// position, then the stream after its sequence). Nothing is fsynced; see
// internal/tracefile for what a power loss can cost.
//
// One tracer writes a home at a time: Run holds a lock in $Home/tracer and
// a second Run on the same home waits for it (a hot standby).
package tracer

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/ops"
	"floe.dev/services/tracer/internal/consume"
)

// Config is the tracer's configuration. Zero-valued tunables take the
// values of DefaultConfig when Validate runs (Run calls it).
type Config struct {
	// Home is $FLOE_HOME (required): Traces go to
	// $Home/traces/<yyyy-mm-dd>/<sid>_<nnn>.jsonl, positions and the lock
	// to $Home/tracer/. Validate makes it absolute.
	Home string
	// Durable is the durable consumer's name, default "floe-tracer". It
	// belongs to one home: tracers writing different homes from one stream
	// need different names (they would split the messages otherwise).
	Durable string
	// Batch is the most messages one pull request asks for, default 1024.
	// One position write per touched Session and one ack cover a batch;
	// measured here, 1024 traces about 1.7× as fast as 256 with 100
	// Sessions interleaved (and 1.4× with one).
	Batch int
	// BatchBytes caps the bytes of one pull request, default 16 MiB, so a
	// batch of large messages stays small in memory.
	BatchBytes int
	// FetchWait is how long a pull request waits for messages before the
	// next one is sent, default 5s (at least 100ms). Messages are handled
	// as they arrive whatever it is.
	FetchWait time.Duration
	// AckWait is how long the server waits for an ack before redelivering,
	// default 30s. The tracer acks each batch in milliseconds, and resets
	// the consumer itself when a delivery may have been lost.
	AckWait time.Duration
	// MaxOpenFiles bounds the Sessions kept in memory with their Trace file
	// open, default 256; the least recently used is closed (its position
	// recorded) to make room and reloaded from its position when needed.
	MaxOpenFiles int
	// RetryMin and RetryMax bound the exponential backoff after a bus or
	// file error, defaults 100ms and 5s; RetryMax is also how often a
	// standby tracer polls for the home's lock.
	RetryMin time.Duration
	RetryMax time.Duration
	// Metrics receives the tracer's series (nil: none are served).
	Metrics prometheus.Registerer
}

// DefaultConfig returns the default tunables; Home is left empty (FromEnv
// reads it from FLOE_HOME).
func DefaultConfig() Config {
	return Config{
		Durable:      "floe-tracer",
		Batch:        1024,
		BatchBytes:   16 << 20,
		FetchWait:    5 * time.Second,
		AckWait:      30 * time.Second,
		MaxOpenFiles: 256,
		RetryMin:     100 * time.Millisecond,
		RetryMax:     5 * time.Second,
	}
}

// FromEnv returns DefaultConfig with Home read from FLOE_HOME through
// getenv (protocol.md §8). The tracer has no other variables; the error is
// there for the shape every service shares.
func FromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.Home = getenv("FLOE_HOME")
	return c, nil
}

// Flags registers the tracer's own flag on fs, bound to c.Home with its
// current value (FromEnv's) as default: --home beats FLOE_HOME.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Home, "home", c.Home, "data root: Traces go to <home>/traces (FLOE_HOME, required)")
}

// Validate fills zero-valued tunables from DefaultConfig, makes Home
// absolute and reports the first invalid setting.
func (c *Config) Validate() error {
	d := DefaultConfig()
	if c.Home == "" {
		return errors.New("tracer: Home is required (set FLOE_HOME)")
	}
	home, err := filepath.Abs(c.Home)
	if err != nil {
		return fmt.Errorf("tracer: home %q: %w", c.Home, err)
	}
	c.Home = home
	if c.Durable == "" {
		c.Durable = d.Durable
	}
	if strings.ContainsAny(c.Durable, ".*> \t\r\n/\\") {
		return fmt.Errorf("tracer: durable name %q may not contain '.', '*', '>', '/', '\\' or whitespace", c.Durable)
	}
	fill(&c.Batch, d.Batch)
	fill(&c.BatchBytes, d.BatchBytes)
	fill(&c.FetchWait, d.FetchWait)
	fill(&c.AckWait, d.AckWait)
	fill(&c.MaxOpenFiles, d.MaxOpenFiles)
	fill(&c.RetryMin, d.RetryMin)
	fill(&c.RetryMax, d.RetryMax)
	switch {
	case c.Batch < 0:
		return fmt.Errorf("tracer: Batch %d is negative", c.Batch)
	case c.BatchBytes < 0:
		return fmt.Errorf("tracer: BatchBytes %d is negative", c.BatchBytes)
	case c.FetchWait < 100*time.Millisecond:
		return fmt.Errorf("tracer: FetchWait %v is below 100ms", c.FetchWait)
	case c.AckWait < time.Second:
		return fmt.Errorf("tracer: AckWait %v is below 1s", c.AckWait)
	case c.MaxOpenFiles < 0:
		return fmt.Errorf("tracer: MaxOpenFiles %d is negative", c.MaxOpenFiles)
	case c.RetryMin < 0 || c.RetryMax < c.RetryMin:
		return fmt.Errorf("tracer: retry backoff %v..%v is not an increasing positive range", c.RetryMin, c.RetryMax)
	}
	return nil
}

// fill sets *v to def when it is zero.
func fill[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Run traces FLOE_SESSIONS into cfg.Home until ctx ends; it returns nil then,
// after its goroutines exit and its last acks are flushed (the caller
// closes nc). It validates cfg first. Bus and file errors are logged and
// retried with backoff, never returned; while another tracer holds the
// home's lock, Run waits for it. The stream must exist (bus.Setup) for
// tracing to start; until it does, Run retries.
func Run(ctx context.Context, nc *nats.Conn, cfg Config, log zerolog.Logger) error {
	log = log.With().Str("service", "tracer").Logger()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if nc == nil {
		return errors.New("tracer: no NATS connection")
	}
	records := ops.MustRegister(cfg.Metrics, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "floe_tracer_records_total", Help: "Trace records written.",
	}))
	var last atomic.Int64       // stream time of the last committed message, unix ns
	var pending atomic.Uint64   // messages pending after the last commit
	var stuckSince atomic.Int64 // stream time of the oldest record a stuck Session lacks, unix ns (0: none)
	ops.MustRegister(cfg.Metrics, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "floe_tracer_lag_seconds",
		Help: "How far the Traces are behind the stream: the age of the last committed message while messages are pending, or of the oldest record a stuck Session's Trace lacks, whichever is older; else 0.",
	}, func() float64 {
		var lag time.Duration
		if pending.Load() > 0 && last.Load() > 0 {
			lag = time.Since(time.Unix(0, last.Load()))
		}
		if s := stuckSince.Load(); s > 0 {
			lag = max(lag, time.Since(time.Unix(0, s)))
		}
		return lag.Seconds()
	}))
	pendingG := ops.MustRegister(cfg.Metrics, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "floe_tracer_pending_messages", Help: "FLOE_SESSIONS messages not yet traced, at the last commit.",
	}))
	stuckG := ops.MustRegister(cfg.Metrics, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "floe_tracer_stuck_sessions", Help: "Sessions whose Trace cannot be written: set aside and retried with backoff while the others are traced.",
	}))
	stuckV := ops.MustRegister(cfg.Metrics, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "floe_tracer_stuck_session_behind_since", Help: "For each stuck Session, the stream time (unix seconds) of the first record its Trace lacks.",
	}, []string{"session_id"}))
	posErrs := ops.MustRegister(cfg.Metrics, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "floe_tracer_position_write_errors_total", Help: "Session positions the shared position table refused: each such Session is set aside (floe_tracer_stuck_sessions) and retried with backoff.",
	}))
	if srv, err := ops.Register(nc, "tracer", "Floe tracer: writes Session Traces", func() any {
		return map[string]any{"home": cfg.Home, "durable": cfg.Durable, "last_committed": time.Unix(0, last.Load()).UTC()}
	}); err != nil {
		log.Warn().Err(err).Msg("not registered as a NATS micro service")
	} else {
		defer srv.Stop()
	}
	return consume.Run(ctx, nc, consume.Options{
		Committed: func(n int, stored time.Time, p uint64) {
			records.Add(float64(n))
			last.Store(stored.UnixNano())
			pending.Store(p)
			pendingG.Set(float64(p))
		},
		Stuck: func(stuck []consume.Stuck) {
			stuckG.Set(float64(len(stuck)))
			stuckV.Reset()
			var oldest int64
			for _, s := range stuck {
				stuckV.WithLabelValues(s.SessionID).Set(float64(s.Since.Unix()))
				if oldest == 0 || s.Since.UnixNano() < oldest {
					oldest = s.Since.UnixNano()
				}
			}
			stuckSince.Store(oldest)
		},
		PositionFailed: func(n int) { posErrs.Add(float64(n)) },
		Home:           cfg.Home,
		Durable:        cfg.Durable,
		Batch:          cfg.Batch,
		BatchBytes:     cfg.BatchBytes,
		FetchWait:      cfg.FetchWait,
		AckWait:        cfg.AckWait,
		MaxOpen:        cfg.MaxOpenFiles,
		RetryMin:       cfg.RetryMin,
		RetryMax:       cfg.RetryMax,
	}, log)
}
