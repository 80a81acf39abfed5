package publish_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/bus/publish"
	"floe.dev/pkg/omni"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// msg is producer p's n-th message on subject class c of Session s.
func msg(sid, class string, p, n int) *nats.Msg {
	m := nats.NewMsg(omni.SessionSubject(sid, class))
	m.Data = []byte(fmt.Sprintf("%d.%d", p, n))
	return m
}

// readAll returns every stored body of the Session in stream order.
func readAll(t testing.TB, js jetstream.JetStream, sid string) []string {
	t.Helper()
	var out []string
	err := bus.Follow(ctxT(t), js, sid, nil, 0, true, func(m bus.StreamMsg) error {
		out = append(out, string(m.Data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkOrder verifies each producer's stored messages are 0..k-1 in order
// (a prefix: nothing after a lost one) and returns k per producer.
func checkOrder(t testing.TB, bodies []string) map[int]int {
	t.Helper()
	next := map[int]int{}
	for i, b := range bodies {
		var p, n int
		if _, err := fmt.Sscanf(b, "%d.%d", &p, &n); err != nil {
			continue
		}
		if n != next[p] {
			t.Fatalf("stored message %d is %s: producer %d's next should be %d (out of order or a gap)", i, b, p, next[p])
		}
		next[p]++
	}
	return next
}

const sid = "session-2026-12-01-10-00-00-0123abcd"

// connect opens another connection to env's server with opts (the
// embedded server's, then these), closed at cleanup, and its JetStream.
func connect(t testing.TB, env *bustest.Env, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := env.Server.Connect(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// drop closes nc's connection from the server side, as a node that goes
// away does; the client reconnects after its reconnect wait.
func drop(t testing.TB, env *bustest.Env, nc *nats.Conn) {
	t.Helper()
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Server.DisconnectClient(cid); err != nil {
		t.Fatal(err)
	}
}

func TestProducersKeepTheirOrderOnOneSubject(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	const producers, each = 4, 3000
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pub := publish.New(env.JS, publish.Options{Queue: 16})
			defer pub.Close()
			for n := range each {
				if err := pub.Publish(ctxT(t), msg(sid, omni.ClassPartial, p, n)); err != nil {
					t.Error(err)
					return
				}
				if n == each/2 {
					// A settle in the middle closes the batch; the next
					// message opens another.
					if _, err := pub.Settle(ctxT(t)); err != nil {
						t.Error(err)
					}
				}
			}
			seq, err := pub.Settle(ctxT(t))
			if err != nil || seq == 0 {
				t.Errorf("settle = %d, %v", seq, err)
			}
		}()
	}
	wg.Wait()
	got := checkOrder(t, readAll(t, env.JS, sid))
	for p := range producers {
		if got[p] != each {
			t.Errorf("producer %d: %d stored, want %d", p, got[p], each)
		}
	}
}

func TestIdempotentMessagesGoOutsideTheBatchInOrder(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	pub := publish.New(env.JS, publish.Options{})
	defer pub.Close()
	ctx := ctxT(t)
	for n := range 10 {
		if err := pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, n)); err != nil {
			t.Fatal(err)
		}
	}
	out := msg(sid, omni.ClassModel, 0, 10)
	out.Header.Set(jetstream.MsgIDHeader, "out-1")
	a, err := pub.Sync(ctx, out)
	if err != nil || a.Duplicate || a.Seq != 11 {
		t.Fatalf("Sync(msg id) = %+v, %v; want seq 11, not duplicate", a, err)
	}
	again := msg(sid, omni.ClassModel, 0, 10)
	again.Header.Set(jetstream.MsgIDHeader, "out-1")
	if a, err := pub.Sync(ctx, again); err != nil || !a.Duplicate {
		t.Fatalf("Sync(same msg id) = %+v, %v; want a duplicate", a, err)
	}
	if got := checkOrder(t, readAll(t, env.JS, sid)); got[0] != 11 {
		t.Errorf("stored %d, want 11", got[0])
	}
}

func TestFenceStopsPublishing(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	var fenced atomic.Bool
	pub := publish.New(env.JS, publish.Options{Fence: func() bool { return !fenced.Load() }})
	defer pub.Close()
	ctx := ctxT(t)
	for n := range 5 {
		pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, n))
	}
	if _, err := pub.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	fenced.Store(true)
	for n := 5; n < 10; n++ {
		pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, n))
	}
	if _, err := pub.Settle(ctx); !errors.Is(err, publish.ErrFenced) {
		t.Fatalf("settle after losing the lease = %v, want ErrFenced", err)
	}
	if got := checkOrder(t, readAll(t, env.JS, sid)); got[0] != 5 {
		t.Errorf("stored %d, want the 5 before the fence", got[0])
	}
}

// TestConnectionDropIsDetectedAndNothingLandsAfterALoss closes the
// publisher's client connection from the server side while it streams:
// whatever was stored is an in-order prefix, the loss is reported by Settle,
// and after Resume the producer goes on in order.
func TestConnectionDropIsDetectedAndNothingLandsAfterALoss(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	// The client's default reconnect wait (2 s) equals the AckTimeout: a
	// drop may be declared a loss before or after the reconnect.
	nc, js := connect(t, env)
	pub := publish.New(js, publish.Options{AckTimeout: 2 * time.Second})
	defer pub.Close()
	ctx := ctxT(t)
	const total = 6000
	failures := 0
	for round := 0; round < 2; round++ {
		for n := round * total; n < (round+1)*total; n++ {
			if n == round*total+total/3 {
				drop(t, env, nc)
			}
			if err := pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, n)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pub.Settle(ctx); err != nil {
			var fe *publish.FailedError
			if !errors.As(err, &fe) {
				t.Fatalf("settle error %v is not a FailedError", err)
			}
			failures++
			t.Logf("round %d: %v", round, err)
		}
		// The owner "restores" what was lost: here it re-sends from the
		// first message not stored, as a retried request would, again
		// while the connection is still down.
		restored := false
		for try := 0; try < 50 && !restored; try++ {
			pub.Resume()
			stored := checkOrder(t, readAll(t, env.JS, sid))[0]
			for n := stored; n < (round+1)*total; n++ {
				if err := pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, n)); err != nil {
					t.Fatal(err)
				}
			}
			_, err := pub.Settle(ctx)
			if restored = err == nil; !restored {
				t.Logf("round %d, restore %d: %v", round, try, err)
				time.Sleep(100 * time.Millisecond)
			}
		}
		if !restored {
			t.Fatalf("round %d: never restored", round)
		}
		if got := checkOrder(t, readAll(t, env.JS, sid))[0]; got != (round+1)*total {
			t.Fatalf("round %d: %d stored, want %d", round, got, (round+1)*total)
		}
	}
	t.Logf("%d of 2 drops lost messages (detected); every stored sequence in order", failures)
}

// TestASlowReconnectNeverStoresWhatWasDeclaredLost drops the publisher's
// connection mid-stream and lets the client reconnect only long after the
// publisher's AckTimeout, when it has declared the loss: nothing sent while
// disconnected is stored later (the connection keeps no reconnect buffer),
// neither the rest of the failed batch nor what was published after a
// Resume during the outage, and after the reconnect the producer goes on
// in order from what the stream holds.
func TestASlowReconnectNeverStoresWhatWasDeclaredLost(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	const ackTimeout = 300 * time.Millisecond
	nc, js := connect(t, env, nats.ReconnectWait(10*ackTimeout))
	pub := publish.New(js, publish.Options{AckTimeout: ackTimeout})
	defer pub.Close()
	ctx := ctxT(t)
	const total = 3000
	for n := range total {
		if n == total/3 {
			drop(t, env, nc)
		}
		if err := pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, n)); err != nil {
			t.Fatal(err)
		}
	}
	var fe *publish.FailedError
	if _, err := pub.Settle(ctx); !errors.As(err, &fe) {
		t.Fatalf("settle across the drop = %v, want a FailedError", err)
	}
	declared := checkOrder(t, readAll(t, env.JS, sid))[0]
	if declared >= total {
		t.Fatalf("all %d messages stored across the drop", declared)
	}
	// The owner resumes while the connection is still down (an engine's
	// recovery does): what it publishes fails too, and must not be kept.
	if nc.IsConnected() {
		t.Fatal("the client reconnected before the publisher declared the loss; the test needs a slower reconnect")
	}
	pub.Resume()
	for n := declared; n < declared+10; n++ {
		if err := pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.Settle(ctx); !errors.As(err, &fe) {
		t.Fatalf("settle while disconnected = %v, want a FailedError", err)
	}
	bustest.Eventually(t, 30*time.Second, "the reconnect", func() bool { return nc.IsConnected() })
	// A message stored through the reconnected connection comes after
	// anything it could have flushed from a buffer.
	marker := publish.New(js, publish.Options{})
	defer marker.Close()
	if _, err := marker.Sync(ctx, msg(sid, omni.ClassEvent, 1, 0)); err != nil {
		t.Fatalf("publish after the reconnect: %v", err)
	}
	if got := checkOrder(t, readAll(t, env.JS, sid))[0]; got != declared {
		t.Fatalf("%d messages stored after the reconnect, %d when the loss was declared: messages sent while disconnected were stored later", got, declared)
	}
	pub.Resume()
	for n := declared; n < total; n++ {
		if err := pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.Settle(ctx); err != nil {
		t.Fatalf("settle after the reconnect: %v", err)
	}
	if got := checkOrder(t, readAll(t, env.JS, sid))[0]; got != total {
		t.Fatalf("%d stored, want %d", got, total)
	}
}

// TestAConnectionThatBuffersIsRefused: a connection with a reconnect
// buffer could send a message after the Publisher declared it lost, so a
// Publisher on one publishes nothing.
func TestAConnectionThatBuffersIsRefused(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	_, js := connect(t, env, nats.ReconnectBufSize(nats.DefaultReconnectBufSize))
	pub := publish.New(js, publish.Options{})
	defer pub.Close()
	ctx := ctxT(t)
	pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, 0))
	if _, err := pub.Settle(ctx); !errors.Is(err, publish.ErrBufferedConn) {
		t.Fatalf("settle on a buffering connection = %v, want ErrBufferedConn", err)
	}
	pub.Resume()
	if _, err := pub.Sync(ctx, msg(sid, omni.ClassPartial, 0, 0)); !errors.Is(err, publish.ErrBufferedConn) {
		t.Fatalf("sync after resume = %v, want ErrBufferedConn", err)
	}
	if got := readAll(t, env.JS, sid); len(got) != 0 {
		t.Errorf("stored %q through a buffering connection", got)
	}
}

// TestSyncAfterNeverOutlivesALoss: a message that depends on an earlier one
// (an approval decision on its tool call) is refused once the producer
// lost a message after the token was taken, even after Resume, and goes
// out with a fresh token.
func TestSyncAfterNeverOutlivesALoss(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	var fenced atomic.Bool
	pub := publish.New(env.JS, publish.Options{Fence: func() bool { return !fenced.Load() }})
	defer pub.Close()
	ctx := ctxT(t)
	tok := pub.Token()
	fenced.Store(true)
	pub.Publish(ctx, msg(sid, omni.ClassModel, 0, 0)) // the dependency, lost
	if _, err := pub.Settle(ctx); err == nil {
		t.Fatal("settle after a loss succeeded")
	}
	if !pub.Failed() {
		t.Fatal("Failed() = false after a loss")
	}
	fenced.Store(false)
	pub.Resume()
	if _, err := pub.SyncAfter(ctx, msg(sid, omni.ClassEvent, 0, 1), tok); !errors.Is(err, publish.ErrStale) {
		t.Fatalf("SyncAfter(token before the loss) = %v, want ErrStale", err)
	}
	if _, err := pub.SyncAfter(ctx, msg(sid, omni.ClassEvent, 0, 0), pub.Token()); err != nil {
		t.Fatalf("SyncAfter(fresh token) = %v", err)
	}
	if got := readAll(t, env.JS, sid); len(got) != 1 || got[0] != "0.0" {
		t.Errorf("stored %q, want only the message sent with a fresh token", got)
	}
}

// bus.PublishJS gives a service whose connection buffers (the client's
// default, kept for its reads) a second one without the buffer, which a
// Publisher accepts; the service's own connection keeps its buffer.
func TestPublishJSHasNoReconnectBuffer(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	nc, _ := connect(t, env, nats.ReconnectBufSize(nats.DefaultReconnectBufSize), nats.Name("floe-engine"))
	js, closePub, err := bus.PublishJS(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer closePub()
	pnc := js.Conn()
	if pnc == nc || pnc.Opts.ReconnectBufSize >= 0 || nc.Opts.ReconnectBufSize < 0 || pnc.Opts.Name != "floe-engine-publish" {
		t.Fatalf("PublishJS on %q (buffer %d), service connection buffer %d; want a second connection without buffer",
			pnc.Opts.Name, pnc.Opts.ReconnectBufSize, nc.Opts.ReconnectBufSize)
	}
	pub := publish.New(js, publish.Options{})
	defer pub.Close()
	if _, err := pub.Sync(ctxT(t), msg(sid, omni.ClassPartial, 0, 0)); err != nil {
		t.Fatalf("publish through PublishJS: %v", err)
	}
	// A connection that has no buffer already is used as it is.
	same, closeSame, err := bus.PublishJS(env.Conn)
	if err != nil || same.Conn() != env.Conn {
		t.Fatalf("PublishJS(no buffer) = %v; want the same connection", err)
	}
	closeSame()
}

// The failure Settle reports is the caller's to read while the Publisher
// goes on dropping (and counting) later messages: it holds the count at
// the time it was reported. (The Publisher once handed out its own
// FailedError and kept incrementing Dropped in it: a data race with the
// caller formatting the error, which -race caught in an engine test.)
func TestAReportedFailureIsTheCallersCopy(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	pub := publish.New(env.JS, publish.Options{Fence: func() bool { return false }})
	defer pub.Close()
	ctx := ctxT(t)
	pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, 0)) // fenced: the failure
	pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, 1)) // dropped after it
	_, err := pub.Settle(ctx)
	var fe *publish.FailedError
	if !errors.As(err, &fe) || fe.Dropped != 1 {
		t.Fatalf("settle = %v, want a FailedError with 1 dropped", err)
	}
	pub.Publish(ctx, msg(sid, omni.ClassPartial, 0, 2)) // dropped while the caller reads err
	text := err.Error()
	_, later := pub.Settle(ctx)
	if fe.Dropped != 1 || !errors.As(later, &fe) || fe.Dropped != 2 {
		t.Fatalf("first report %q, the next %v: want 1 then 2 dropped", text, later)
	}
}
