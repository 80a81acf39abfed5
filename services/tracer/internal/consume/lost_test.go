package consume_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	tt "floe.dev/services/tracer/internal/tracertest"
)

// A delivery the tracer never receives stays pending on its consumer while
// later messages are delivered; acknowledging one of those (AckAll) would
// acknowledge it too and its record would be missing from the Trace. In a
// cluster that happens without any error (a pull request's end overtakes
// its last, replicated, delivery), and on a reconnect. Here another client
// pulls from the tracer's consumer while records trickle in, until it has
// taken one delivery: the tracer sees the consumer sequence jump, resets
// the consumer at once, and the Trace still holds every record in stream
// order.
func TestADeliveryThatNeverArrivedIsRedelivered(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	o := options(home)
	o.Batch = 1 // one message a pull request: the thief's requests get their turn
	// A reset after a delivery is immediate: with a backoff the catch-up
	// after a leader change took a minute.
	o.RetryMin, o.RetryMax = time.Hour, time.Hour
	run(t, env, o, zerolog.New(zerolog.NewTestWriter(t)))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := env.JS.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	for err != nil && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
		cons, err = env.JS.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	}
	if err != nil {
		t.Fatal(err)
	}
	stolen := make(chan struct{})
	go func() {
		defer close(stolen)
		for ctx.Err() == nil {
			b, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for range b.Messages() {
				return // taken, never acknowledged
			}
		}
	}()
	n := 0
	for ; n < len(items); n++ {
		select {
		case <-stolen:
		default:
			tt.Publish(t, env.JS, items[n])
			time.Sleep(5 * time.Millisecond)
			continue
		}
		break
	}
	<-stolen
	if ctx.Err() != nil {
		t.Fatal("the other client never took a delivery")
	}
	tt.Publish(t, env.JS, items[n:]...)
	tt.WaitTrace(t, env.JS, home, sid)
}
