package consume_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	tt "floe.dev/services/tracer/internal/tracertest"
)

// traceItems counts the items published on a Trace class.
func traceItems(items []tt.Item) int {
	n := 0
	for _, it := range items {
		if _, class, ok := omni.ParseSessionSubject(it.Subject); ok && slices.Contains(omni.TraceClasses, class) {
			n++
		}
	}
	return n
}

// narrowed waits until the tracer's consumer is filtered to the Trace
// classes (it narrows once it has caught up) and returns its info.
func narrowed(t *testing.T, env *bustest.Env) *jetstream.ConsumerInfo {
	t.Helper()
	var info *jetstream.ConsumerInfo
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bustest.Eventually(t, 20*time.Second, "the tracer's consumer narrowed to the Trace classes", func() bool {
		c, err := env.JS.Consumer(ctx, omni.SessionsStream, "floe-tracer")
		if err != nil {
			return false
		}
		info, err = c.Info(ctx)
		return err == nil && len(info.Config.FilterSubjects) == len(omni.TraceClasses) && info.NumAckPending == 0
	})
	return info
}

// deltas are n partials of sid, with a server event every tenth.
func deltas(t *testing.T, sid string, n int) []tt.Item {
	var items []tt.Item
	for i := range n {
		items = append(items, tt.Msg(t, sid, omni.Partial(omni.TypeText, omni.EventDelta, "delta ", "", "")))
		if i%10 == 0 {
			items = append(items, tt.Item{Subject: omni.SessionSubject(sid, omni.ClassServer), Data: []byte(`{"type":"task_state","state":"running"}`)})
		}
	}
	return items
}

// Once caught up, the tracer is never delivered a streaming Session's
// partials, nested messages or server events (protocol.md §2): its
// consumer's filters are the Trace classes, so the deliveries are exactly
// the Trace-class messages while the Trace holds every record.
func TestPartialsNeverReachACaughtUpTracer(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	run(t, env, options(home), zerolog.Nop())
	tt.Publish(t, env.JS, items[:3]...)
	before := narrowed(t, env).Delivered.Consumer

	rest := append(deltas(t, sid, 200), items[3:]...)
	rest = append(rest, deltas(t, sid, 50)...)
	rest = append(rest, tt.Turn(t, sid, 2)...)
	tt.Publish(t, env.JS, rest...)
	tt.WaitTrace(t, env.JS, home, sid)
	info := narrowed(t, env)
	want := uint64(traceItems(rest))
	if got := info.Delivered.Consumer - before; got != want || info.NumPending != 0 {
		t.Errorf("consumer delivered %d (pending %d), want the %d Trace-class messages of %d published",
			got, info.NumPending, want, len(rest))
	}
}

// A tracer far behind takes the whole stream (a filtered consumer's
// catch-up costs nats-server a walk of the block's subjects per delivery)
// and narrows again once it has caught up; the Trace is the same.
func TestABehindTracerTakesTheWholeStreamThenNarrows(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	stop := run(t, env, options(home), zerolog.Nop())
	tt.Publish(t, env.JS, items[:3]...)
	narrowed(t, env)
	stop()

	// More Trace records than behindLimit arrive while it is away.
	var backlog []tt.Item
	for i := range 1200 {
		backlog = append(backlog, tt.Msg(t, sid, omni.UserText(fmt.Sprintf("message %d", i))))
		backlog = append(backlog, tt.Msg(t, sid, omni.Partial(omni.TypeText, omni.EventDelta, "delta ", "", "")))
	}
	tt.PublishAsync(t, env.JS, backlog...)
	tt.PublishAsync(t, env.JS, items[3:]...)
	before := consumerInfo(t, env).Delivered.Consumer
	run(t, env, options(home), zerolog.Nop())
	tt.WaitTrace(t, env.JS, home, sid)
	info := narrowed(t, env)
	// Behind, it was delivered the partials too.
	if got, trace := info.Delivered.Consumer-before, uint64(traceItems(backlog)+traceItems(items[3:])); got <= trace {
		t.Errorf("delivered %d while catching up, want more than the %d Trace-class messages (the whole stream)", got, trace)
	}
}

// A home traced by an older tracer has a consumer whose filter is the
// whole stream: the next tracer updates it in place, keeping its ack
// floor, traces what came after without a gap or a repeat, and narrows it.
func TestAnOlderTracersWholeStreamConsumerIsNarrowed(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	half := len(items) / 2
	stop := run(t, env, options(home), zerolog.Nop())
	tt.Publish(t, env.JS, items[:half]...)
	tt.WaitTrace(t, env.JS, home, sid)
	narrowed(t, env)
	stop()

	// What the tracer of the previous release made.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	floor := consumerInfo(t, env).AckFloor.Stream
	_, err := env.JS.UpdateConsumer(ctx, omni.SessionsStream, jetstream.ConsumerConfig{
		Durable: "floe-tracer", FilterSubject: omni.SessionSubjects,
		AckPolicy: jetstream.AckAllPolicy, AckWait: 30 * time.Second, MaxAckPending: 4096, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatalf("make the old consumer: %v", err)
	}
	if info := consumerInfo(t, env); len(info.Config.FilterSubjects) != 0 || info.AckFloor.Stream != floor {
		t.Fatalf("old consumer: filters %q, floor %d, want none and %d", info.Config.FilterSubjects, info.AckFloor.Stream, floor)
	}

	tt.Publish(t, env.JS, items[half:]...)
	run(t, env, options(home), zerolog.Nop())
	tt.WaitTrace(t, env.JS, home, sid)
	if info := narrowed(t, env); info.NumPending != 0 {
		t.Errorf("pending %d after the Trace is written, want 0", info.NumPending)
	}
}
