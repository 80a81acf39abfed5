package consume_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
// its last, replicated, delivery). Here another client takes one delivery
// from the tracer's consumer between two of the tracer's pull requests:
// the tracer sees the consumer sequence jump, resets the consumer at once,
// and the Trace still holds every record in stream order.
func TestADeliveryThatNeverArrivedIsRedelivered(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	tt.Publish(t, env.JS, items[0])

	o := options(home)
	o.Batch = 1 // each pull request ends with its message: none waits
	// A reset after a fetch that delivered is immediate: with a backoff
	// the catch-up after a leader change took a minute.
	o.RetryMin, o.RetryMax = time.Hour, time.Hour
	var once sync.Once
	stolen := make(chan error, 1)
	o.Hooks.AfterFlush = func(uint64) error {
		once.Do(func() { stolen <- steal(env.JS, items[1]) })
		return nil
	}
	run(t, env, o, zerolog.New(zerolog.NewTestWriter(t)))
	select {
	case err := <-stolen:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the tracer never committed its first record")
	}
	tt.Publish(t, env.JS, items[2:]...)
	tt.WaitTrace(t, env.JS, home, sid)
}

// steal publishes it and takes its delivery from the tracer's consumer
// without acknowledging it.
func steal(js jetstream.JetStream, it tt.Item) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: it.Subject, Data: it.Data}); err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	if err != nil {
		return err
	}
	b, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		return err
	}
	n := 0
	for range b.Messages() {
		n++
	}
	if n != 1 {
		return fmt.Errorf("took %d deliveries, want 1 (%v)", n, b.Error())
	}
	return nil
}
