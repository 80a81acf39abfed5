package embed

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The engine's and the gateway's consumer permissions on FLOE_SESSIONS do
// not reach the tracer's durable: they can neither delete it, re-create it
// with another configuration (by its name in the subject or in the body),
// reset it nor pull its messages, while their own consumers work.
func TestOnlyTheTracerTouchesItsDurable(t *testing.T) {
	s, creds, _ := startAuthed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := func(user string) *nats.Conn {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, creds[user]), nats.CustomInboxPrefix("_INBOX."+user))
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	connect := func(user string) jetstream.JetStream {
		js, _ := jetstream.New(conn(user))
		return js
	}
	admin := connect(UserAdmin)
	if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOE_SESSIONS", Subjects: []string{"floe.session.>"}}); err != nil {
		t.Fatal(err)
	}
	tracerCfg := jetstream.ConsumerConfig{Durable: "floe-tracer", AckPolicy: jetstream.AckAllPolicy, FilterSubject: "floe.session.>"}
	if _, err := connect(UserTracer).CreateOrUpdateConsumer(ctx, "FLOE_SESSIONS", tracerCfg); err != nil {
		t.Fatalf("the tracer creates its durable: %v", err)
	}
	if _, err := admin.Publish(ctx, "floe.session.s1.model", []byte("m")); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{UserEngine, UserGateway} {
		nc := conn(user)
		js, _ := jetstream.New(nc)
		short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }
		c1, cancel1 := short()
		if err := js.DeleteConsumer(c1, "FLOE_SESSIONS", "floe-tracer"); err == nil {
			t.Errorf("%s deleted the tracer's durable", user)
		}
		cancel1()
		c2, cancel2 := short()
		evil := tracerCfg
		evil.FilterSubject = "floe.session.nothing.>"
		if _, err := js.CreateOrUpdateConsumer(c2, "FLOE_SESSIONS", evil); err == nil {
			t.Errorf("%s re-configured the tracer's durable", user)
		}
		cancel2()
		// The unnamed (legacy ephemeral) create names the consumer in the
		// body: with "name": "floe-tracer" it replaced the durable's
		// filter.
		body := `{"stream_name":"FLOE_SESSIONS","config":{"name":"floe-tracer","ack_policy":"all","filter_subject":"floe.session.nothing.>"}}`
		if m, err := nc.Request("$JS.API.CONSUMER.CREATE.FLOE_SESSIONS", []byte(body), 2*time.Second); err == nil {
			t.Errorf("%s re-configured the tracer's durable through the unnamed create: %s", user, m.Data)
		}
		c3, cancel3 := short()
		if _, err := js.ResetConsumer(c3, "FLOE_SESSIONS", "floe-tracer"); err == nil {
			t.Errorf("%s reset the tracer's durable", user)
		}
		cancel3()
		// Its own consumers still work (what the role is for).
		c4, cancel4 := short()
		own, err := js.OrderedConsumer(c4, "FLOE_SESSIONS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"floe.session.s1.>"}})
		if err != nil {
			t.Fatalf("%s: its own consumer: %v", user, err)
		}
		if m, err := own.Next(jetstream.FetchMaxWait(2 * time.Second)); err != nil || string(m.Data()) != "m" {
			t.Fatalf("%s: its own consumer read %v, %v", user, m, err)
		}
		cancel4()
	}
	// ops reads with ephemeral consumers of its own; pulling from the
	// tracer's durable would hold its messages from the tracer (ops
	// cannot ack them) until their ack wait ends.
	opsJS := connect(UserOps)
	c5, cancel5 := context.WithTimeout(ctx, 2*time.Second)
	if tc, err := opsJS.Consumer(c5, "FLOE_SESSIONS", "floe-tracer"); err != nil {
		t.Errorf("ops cannot look at the tracer's durable: %v", err)
	} else if b, err := tc.Fetch(1, jetstream.FetchMaxWait(time.Second)); err == nil {
		for m := range b.Messages() {
			t.Errorf("ops pulled %q from the tracer's durable", m.Data())
		}
	}
	cancel5()
	info, err := admin.Consumer(ctx, "FLOE_SESSIONS", "floe-tracer")
	if err != nil {
		t.Fatalf("the tracer's durable is gone: %v", err)
	}
	if c := info.CachedInfo(); c.Config.FilterSubject != "floe.session.>" || c.NumPending != 1 || c.NumAckPending != 0 {
		t.Fatalf("the tracer's durable changed: filter %q, pending %d, ack pending %d", c.Config.FilterSubject, c.NumPending, c.NumAckPending)
	}
}
