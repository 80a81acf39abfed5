package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
	"floe.dev/services/tracer"
)

const (
	aliceToken = "tok-alice"
	bobToken   = "tok-bob"
	waitLimit  = 20 * time.Second
)

func newBus(t testing.TB) *bustest.Env {
	t.Helper()
	return bustest.Start(t, bus.Config{})
}

// testGateway is one gateway instance behind an httptest server whose
// handler can be swapped (a restarted gateway on the same URL).
type testGateway struct {
	URL     string
	HTTP    *httptest.Server
	handler atomic.Pointer[http.Handler]
	release func()
	Home    string
	Alice   *client.Client
	Bob     *client.Client
	env     *bustest.Env
	cfg     gateway.Config
}

func testConfig(home string) gateway.Config {
	return gateway.Config{
		Addr:      "127.0.0.1:0",
		Tokens:    map[string]string{aliceToken: "alice", bobToken: "bob"},
		Home:      home,
		Heartbeat: time.Second,
		QueueWait: 500 * time.Millisecond,
	}
}

func startGateway(t testing.TB, env *bustest.Env, home string, configure func(*gateway.Config)) *testGateway {
	t.Helper()
	if home == "" {
		home = t.TempDir()
	}
	cfg := testConfig(home)
	if configure != nil {
		configure(&cfg)
	}
	g := &testGateway{Home: home, env: env, cfg: cfg}
	g.swap(t)
	g.HTTP = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*g.handler.Load()).ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		g.HTTP.CloseClientConnections()
		g.release()
		g.HTTP.Close()
	})
	g.URL = g.HTTP.URL
	g.Alice = client.New(g.URL, client.WithToken(aliceToken))
	g.Bob = client.New(g.URL, client.WithToken(bobToken))
	return g
}

// swap replaces the handler by a new gateway instance (own NATS connection)
// on the same URL, releasing the old one: a gateway restart.
func (g *testGateway) swap(t testing.TB) {
	t.Helper()
	nc := bustest.Connect(t, g.env.Server)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, release, err := gateway.NewHandler(ctx, nc, g.cfg, zerolog.Nop())
	if err != nil {
		t.Fatalf("NewHandler: %v", err)
	}
	old := g.release
	g.handler.Store(&h)
	g.release = func() { release(); nc.Close() }
	if old != nil {
		old()
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond every 10ms until it holds or waitLimit passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	bustest.Eventually(t, waitLimit, what, cond)
}

// collector reads a client stream into a slice.
type collector struct {
	t      testing.TB
	s      *client.Stream
	cancel context.CancelFunc
	got    []client.Event
}

func openStream(t testing.TB, c *client.Client, sid, lastID string) *collector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.Stream(ctx, sid, lastID, client.WithReconnectDelay(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		cancel()
		t.Fatalf("open stream: %v", err)
	}
	col := &collector{t: t, s: s, cancel: cancel}
	t.Cleanup(col.close)
	return col
}

func (c *collector) close() {
	c.cancel()
	<-c.s.Done()
}

// next returns the next event.
func (c *collector) next() client.Event {
	c.t.Helper()
	select {
	case ev, ok := <-c.s.C:
		if !ok {
			c.t.Fatalf("stream ended: %v", c.s.Err())
		}
		c.got = append(c.got, ev)
		return ev
	case <-time.After(waitLimit):
		c.t.Fatalf("no event within %v (got %d so far)", waitLimit, len(c.got))
	}
	return client.Event{}
}

// until reads events until pred holds for one and returns it.
func (c *collector) until(what string, pred func(client.Event) bool) client.Event {
	c.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		if ev := c.next(); pred(ev) {
			return ev
		}
	}
	c.t.Fatalf("timed out waiting for %s", what)
	return client.Event{}
}

func serverEvent(ev client.Event) (omni.ServerEvent, bool) {
	var se omni.ServerEvent
	if ev.Event != client.EventServer || json.Unmarshal(ev.Data, &se) != nil {
		return se, false
	}
	return se, true
}

func isTaskState(state string) func(client.Event) bool {
	return func(ev client.Event) bool {
		se, ok := serverEvent(ev)
		return ok && se.Type == omni.ServerTaskState && se.State == state
	}
}

// idleAfterRun matches the task_state idle a Task ends with (a stream event).
func idleEvent(ev client.Event) bool { return ev.ID != "" && isTaskState(omni.StateIdle)(ev) }

func payloadType(data []byte) string {
	var m omni.Message
	if omni.Unmarshal(data, &m) != nil {
		return ""
	}
	return m.Payload.Type
}

func isDelta(ev client.Event) bool {
	var m omni.Message
	return ev.Event == "" && omni.Unmarshal(ev.Data, &m) == nil && m.Payload.Type == omni.TypePartialText && m.Payload.EventType == omni.EventDelta
}

func seqOf(t testing.TB, id string) uint64 {
	t.Helper()
	_, s, ok := strings.Cut(id, "-")
	n, err := strconv.ParseUint(s, 10, 64)
	if !ok || err != nil {
		t.Fatalf("bad event id %q", id)
	}
	return n
}

// streamed is one message of FLOE_SESSIONS.
type streamed struct {
	Seq  uint64
	Data string
}

// busStream reads a Session's client-stream classes straight from JetStream.
func busStream(t testing.TB, env *bustest.Env, sid string) []streamed {
	t.Helper()
	var out []streamed
	err := bus.FollowUntil(ctxT(t), env.JS, sid, omni.ClientClasses, 0, true, func(m bus.StreamMsg) error {
		out = append(out, streamed{m.Seq, string(m.Data)})
		return nil
	})
	if err != nil {
		t.Fatalf("read stream: %v", err)
	}
	return out
}

// withIDs keeps the events that carry an id, as (seq, data).
func withIDs(t testing.TB, evs []client.Event) []streamed {
	var out []streamed
	for _, ev := range evs {
		if ev.ID != "" {
			out = append(out, streamed{seqOf(t, ev.ID), string(ev.Data)})
		}
	}
	return out
}

func equalStreams(t testing.TB, got, want []streamed) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d stream events, want %d\n got: %v\nwant: %v", len(got), len(want), seqs(got), seqs(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("event %d = %d %s, want %d %s", i, got[i].Seq, got[i].Data, want[i].Seq, want[i].Data)
		}
	}
}

func seqs(s []streamed) []uint64 {
	out := make([]uint64, len(s))
	for i, m := range s {
		out[i] = m.Seq
	}
	return out
}

func createSession(t testing.TB, c *client.Client, req client.CreateSession) *client.Session {
	t.Helper()
	s, err := c.CreateSession(ctxT(t), req)
	if err != nil {
		t.Fatalf("create session: %v", err)
	}
	return s
}

func submit(t testing.TB, c *client.Client, sid, text string) string {
	t.Helper()
	id, err := c.SubmitTask(ctxT(t), sid, client.TaskRequest{Input: []client.InputPart{{Type: "text", Text: text}}})
	if err != nil {
		t.Fatalf("submit task: %v", err)
	}
	return id
}

func waitIdle(t testing.TB, env *bustest.Env, sid string) {
	t.Helper()
	eventually(t, "session idle", func() bool {
		r, _, err := env.Sessions.Get(context.Background(), sid)
		return err == nil && (r.State == omni.StateIdle || r.State == "")
	})
}

// gate blocks deltas at or after a given index until released.
type gate struct {
	at      int
	release chan struct{}
	reached chan struct{}
}

func newGate(at int) *gate {
	return &gate{at: at, release: make(chan struct{}), reached: make(chan struct{})}
}

func (g *gate) hold(ctx context.Context, _ string, i int) {
	if i != g.at {
		return
	}
	close(g.reached)
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

func (g *gate) open() { close(g.release) }

func (g *gate) waitReached(t testing.TB) {
	t.Helper()
	select {
	case <-g.reached:
	case <-time.After(waitLimit):
		t.Fatal("engine never reached the gate")
	}
}

// cursorSeq checks that a /messages live cursor is in the SSE id format
// "<epoch>-<seq>" (protocol.md §3) and returns its sequence.
func cursorSeq(t testing.TB, l *client.Live) uint64 {
	t.Helper()
	epoch, seq, ok := client.ParseEventID(l.Cursor)
	if !ok || epoch <= 0 {
		t.Fatalf("live cursor %q is not <epoch>-<seq>", l.Cursor)
	}
	return seq
}

// startTracer runs a tracer on home until the test ends: it purges a
// deleted Session's messages (the gateway may not) and deletes its Trace.
func startTracer(t testing.TB, env *bustest.Env, home string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := tracer.DefaultConfig()
	cfg.Home = home
	go func() { done <- tracer.Run(ctx, env.Conn, cfg, zerolog.Nop()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tracer: %v", err)
		}
	})
}
