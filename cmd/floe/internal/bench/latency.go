package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// LatencyResult is publish→SSE latency with Sessions Sessions streaming at
// once, one SSE client each.
type LatencyResult struct {
	Sessions      int
	Rate          float64 // partials per second over all Sessions
	PerSession    float64 // partials per second per Session
	Messages      int     // measured partials (after a second of warm-up at the same rate)
	P50, P99, Max time.Duration
	// BareP50, BareP99 and BareMax are the same publishes received by bare
	// JetStream (one ordered consumer per Session), measured right after.
	BareP50, BareP99, BareMax time.Duration
	Connect                   time.Duration // opening every SSE stream (snapshot read)
	IdleConnection            *memDelta     // per idle SSE connection, when measured at this shape
	// RaisedMaxConsumers: FLOE_SESSIONS's consumer limit was raised for
	// this shape; see serverDefaultMaxConsumers.
	RaisedMaxConsumers bool
}

// serverDefaultMaxConsumers is nats-server's default_max_consumers (2.15):
// a stream that sets no max_consumers of its own (FLOE_SESSIONS does not)
// holds at most this many consumers. Every SSE client is one consumer on
// FLOE_SESSIONS, as are the tracer and every running Task's follower, so as
// configured a Floe serves fewer than 1000 SSE clients per stream; shapes
// that need more raise the stream's own limit and the report says so.
const serverDefaultMaxConsumers = 1000

// consumerHeadroom covers the consumers other than the SSE clients (tracer,
// engine).
const consumerHeadroom = 8

// raiseMaxConsumers sets FLOE_SESSIONS's max_consumers to n.
func raiseMaxConsumers(ctx context.Context, e *env, n int) error {
	s, err := e.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return err
	}
	cfg := s.CachedInfo().Config
	cfg.MaxConsumers = n
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bench: raise max consumers of %s: %w", omni.SessionsStream, err)
	}
	return nil
}

var (
	stampMark = []byte(`"text":"t`)
	warmMark  = []byte(`"text":"w`)
)

// latencyText pads a stamped delta to about the size of a model's token
// delta (the engine's partials of BenchmarkEnginePathPartials are 20
// characters).
const latencyPad = " lorem ipsum"

// runLatency measures each shape in a fresh env: Sessions are created
// through the gateway's API, every client opens its SSE stream, one
// warm-up partial per Session reaches every client, then stamped partials
// (omni.Partial, published asynchronously on one connection as the engine
// does) go out round-robin at a fixed aggregate rate and every client
// records now − stamp.
func runLatency(ctx context.Context, c *Config, p *progress) ([]LatencyResult, error) {
	var out []LatencyResult
	for _, sessions := range c.Sessions {
		per := max(int(c.Rate*c.LatencyFor.Seconds()/float64(sessions)+0.5), 1)
		r, err := latencyShape(ctx, c, p, sessions, per, sessions == c.Sessions[len(c.Sessions)-1])
		if err != nil {
			return nil, fmt.Errorf("latency at %d Sessions: %w", sessions, err)
		}
		out = append(out, *r)
	}
	return out, nil
}

func latencyShape(ctx context.Context, c *Config, p *progress, sessions, per int, measureIdle bool) (*LatencyResult, error) {
	e, err := startEnv(ctx, c.root, fmt.Sprintf("latency-%d", sessions), true, c.Log)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	res := &LatencyResult{Sessions: sessions, Rate: c.Rate, PerSession: c.Rate / float64(sessions), Messages: per * sessions}
	if sessions+consumerHeadroom > serverDefaultMaxConsumers {
		if err := raiseMaxConsumers(ctx, e, 100_000); err != nil {
			return nil, err
		}
		res.RaisedMaxConsumers = true
	}
	p.logf("latency %d Sessions: creating Sessions", sessions)
	sids, err := createSessions(ctx, e, sessions)
	if err != nil {
		return nil, err
	}
	if measureIdle {
		d, err := idleSSE(ctx, e, sids)
		if err != nil {
			return nil, err
		}
		res.IdleConnection = d
	}
	p.logf("latency %d Sessions: opening SSE streams", sessions)
	began := time.Now()
	conns := make([]*sseConn, sessions)
	defer func() {
		for _, cn := range conns {
			if cn != nil {
				cn.close()
			}
		}
	}()
	if err := parallel(ctx, sessions, 16, func(i int) error {
		cn, err := dialSSE(ctx, e.addr, sids[i], 4096)
		if err != nil {
			return err
		}
		conns[i] = cn
		if _, err := cn.next(); err != nil { // snapshot: live from here
			return fmt.Errorf("bench: snapshot: %w", err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	res.Connect = time.Since(began)
	stop := context.AfterFunc(ctx, func() {
		for _, cn := range conns {
			cn.close()
		}
	})
	defer stop()

	var (
		mu      sync.Mutex
		lats    = make([]time.Duration, 0, per*sessions)
		warmed  atomic.Int64
		failed  atomic.Int64
		lastErr atomic.Value
		wg      sync.WaitGroup
	)
	for _, cn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, per)
			for len(local) < per {
				ev, err := cn.next()
				if err != nil {
					failed.Add(1)
					lastErr.Store(err)
					return
				}
				now := time.Now().UnixNano()
				if ev.server {
					continue
				}
				i := bytes.Index(ev.data, stampMark)
				if i < 0 {
					if bytes.Contains(ev.data, warmMark) {
						warmed.Add(1)
					}
					continue
				}
				rest := ev.data[i+len(stampMark):]
				if j := bytes.IndexByte(rest, ' '); j > 0 {
					if ns, err := strconv.ParseInt(string(rest[:j]), 10, 64); err == nil {
						local = append(local, time.Duration(now-ns))
					}
				}
			}
			mu.Lock()
			lats = append(lats, local...)
			mu.Unlock()
		}()
	}
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()

	// Warm-up: a second at the same rate (at least one partial per
	// Session), every one delivered before measuring.
	warmPer := max(int(c.Rate/float64(sessions)+0.5), 1)
	p.logf("latency %d Sessions: warm-up, %d partials", sessions, warmPer*sessions)
	if err := publishPaced(ctx, e, sids, warmPer*sessions, c.Rate, func() string { return "w0" }); err != nil {
		return nil, err
	}
	want := int64(warmPer * sessions)
	if err := waitFor(ctx, 60*time.Second, func() bool { return warmed.Load() == want || failed.Load() > 0 }); err != nil || failed.Load() > 0 {
		return nil, fmt.Errorf("bench: warm-up delivered %d of %d partials (%d clients failed: %v)", warmed.Load(), want, failed.Load(), lastErr.Load())
	}

	p.logf("latency %d Sessions: %d partials at %.0f/s (%.3g/s per Session)", sessions, per*sessions, c.Rate, res.PerSession)
	if err := publishPaced(ctx, e, sids, per*sessions, c.Rate, func() string {
		return "t" + strconv.FormatInt(time.Now().UnixNano(), 10)
	}); err != nil {
		return nil, err
	}
	select {
	case <-allDone:
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("bench: clients still waiting 60s after the last publish (%d failed)", failed.Load())
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if n := failed.Load(); n > 0 {
		return nil, fmt.Errorf("bench: %d SSE clients failed: %v", n, lastErr.Load())
	}
	res.P50, res.P99, res.Max = percentiles(lats)
	for _, cn := range conns {
		cn.close()
	}
	p.logf("latency %d Sessions: the same through bare JetStream", sessions)
	bare, err := bareLatency(ctx, e, sids, per, c.Rate)
	if err != nil {
		return nil, err
	}
	res.BareP50, res.BareP99, res.BareMax = percentiles(bare)
	return res, nil
}

// percentiles sorts lats and returns its p50, p99 and max.
func percentiles(lats []time.Duration) (p50, p99, top time.Duration) {
	if len(lats) == 0 {
		return 0, 0, 0
	}
	slices.Sort(lats)
	pct := func(q float64) time.Duration { return lats[int(q*float64(len(lats)-1))] }
	return pct(0.50), pct(0.99), lats[len(lats)-1]
}

// bareLatency publishes per stamped partials on every Session, paced as
// the SSE run, received by one ordered consumer per Session (what a
// client of JetStream itself would use), after one warm-up partial each;
// every consumer is deleted after.
func bareLatency(ctx context.Context, e *env, sids []string, per int, rate float64) ([]time.Duration, error) {
	var (
		mu     sync.Mutex
		lats   = make([]time.Duration, 0, per*len(sids))
		warmed atomic.Int64
		got    atomic.Int64
	)
	var stops []func()
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	for _, sid := range sids {
		cons, err := e.js.OrderedConsumer(ctx, omni.SessionsStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{omni.SessionSubject(sid, omni.ClassPartial)},
			DeliverPolicy:  jetstream.DeliverNewPolicy,
		})
		if err != nil {
			return nil, fmt.Errorf("bench: bare consumer: %w", err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			now := time.Now().UnixNano()
			data := m.Data()
			i := bytes.Index(data, stampMark)
			if i < 0 {
				if bytes.Contains(data, warmMark) {
					warmed.Add(1)
				}
				return
			}
			rest := data[i+len(stampMark):]
			if j := bytes.IndexByte(rest, ' '); j > 0 {
				if ns, err := strconv.ParseInt(string(rest[:j]), 10, 64); err == nil {
					mu.Lock()
					lats = append(lats, time.Duration(now-ns))
					mu.Unlock()
				}
			}
			got.Add(1)
		})
		if err != nil {
			return nil, fmt.Errorf("bench: bare consume: %w", err)
		}
		stops = append(stops, func() { cc.Stop(); bus.DeleteConsumer(e.js, cons) })
	}
	warmPer := max(int(rate/float64(len(sids))+0.5), 1)
	if err := publishPaced(ctx, e, sids, warmPer*len(sids), rate, func() string { return "w0" }); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 60*time.Second, func() bool { return warmed.Load() == int64(warmPer*len(sids)) }); err != nil {
		return nil, fmt.Errorf("bench: bare warm-up: %d of %d", warmed.Load(), warmPer*len(sids))
	}
	if err := publishPaced(ctx, e, sids, per*len(sids), rate, func() string {
		return "t" + strconv.FormatInt(time.Now().UnixNano(), 10)
	}); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 60*time.Second, func() bool { return got.Load() == int64(per*len(sids)) }); err != nil {
		return nil, fmt.Errorf("bench: bare consumers got %d of %d", got.Load(), per*len(sids))
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(lats), nil
}

// idleSSE opens one SSE stream per Session with a client that keeps
// nothing but its socket once the snapshot is read, and returns the
// process's growth per connection (after GC, a second later). The streams
// are closed before it returns.
func idleSSE(ctx context.Context, e *env, sids []string) (*memDelta, error) {
	before := snapshot()
	conns := make([]net.Conn, len(sids))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err := parallel(ctx, len(sids), 16, func(i int) error {
		cn, err := dialSSE(ctx, e.addr, sids[i], 256)
		if err != nil {
			return err
		}
		if _, err := cn.next(); err != nil {
			cn.close()
			return fmt.Errorf("bench: snapshot: %w", err)
		}
		conns[i] = cn.c // the readers are dropped: only the socket stays
		return nil
	}); err != nil {
		return nil, err
	}
	time.Sleep(time.Second)
	d := deltaPer(before, snapshot(), len(sids))
	return &d, nil
}

// publishPaced publishes n stamped partials round-robin over sids at rate
// per second, then waits for their acks.
func publishPaced(ctx context.Context, e *env, sids []string, n int, rate float64, stamp func() string) error {
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for k := range n {
		if err := retry.Sleep(ctx, time.Until(start.Add(time.Duration(k)*interval))); err != nil {
			return err
		}
		if err := publishStamped(ctx, e, sids[k%len(sids)], stamp()); err != nil {
			return err
		}
	}
	return e.flush(ctx)
}

// publishStamped publishes one partial_text delta whose text starts with
// stamp and a space, as the engine publishes a model delta.
func publishStamped(ctx context.Context, e *env, sid, stamp string) error {
	m := omni.Partial(omni.TypeText, omni.EventDelta, stamp+latencyPad, "", "")
	nm, err := bus.SessionMsg(sid, &m, "")
	if err != nil {
		return err
	}
	return e.publishAsync(ctx, nm)
}

// createSessions creates n Sessions through the gateway's API (the default
// model; no Task runs) and returns their ids.
func createSessions(ctx context.Context, e *env, n int) ([]string, error) {
	sids := make([]string, n)
	err := parallel(ctx, n, 8, func(i int) error {
		s, err := e.api.CreateSession(ctx, client.CreateSession{})
		if err != nil {
			return fmt.Errorf("bench: create session: %w", err)
		}
		sids[i] = s.ID
		return nil
	})
	return sids, err
}

// parallel runs fn(0..n-1) on workers goroutines and returns the first error.
func parallel(parent context.Context, n, workers int, fn func(i int) error) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		return parent.Err()
	}
	return first
}

// waitFor polls cond every 5ms until it holds, ctx ends or limit passes.
func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: condition not met within %v", limit)
		}
		if err := retry.Sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}
