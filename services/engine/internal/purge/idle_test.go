package purge

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// idleSession creates a Session that ran one Task: its messages of every
// class are on the stream and its record is idle.
func idleSession(t *testing.T, env *bustest.Env, sid string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := env.Sessions.Create(ctx, &omni.SessionRecord{ID: sid, Model: "scripted:demo", State: omni.StateIdle}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Sessions.Begin(ctx, sid, omni.StateRunning, "t1"); err != nil {
		t.Fatal(err)
	}
	for _, m := range []omni.Message{
		omni.UserText("hello"),
		omni.Partial(omni.TypeText, omni.EventDelta, "piece ", "", ""),
		omni.Text(omni.RoleAssistant, "piece"),
	} {
		nm, err := bus.SessionMsg(sid, &m, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.JS.PublishMsg(ctx, &nats.Msg{Subject: nm.Subject, Data: nm.Data, Header: nm.Header}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.JS.Publish(ctx, omni.SessionSubject(sid, omni.ClassServer), []byte(`{"type":"task_state","state":"idle"}`)); err != nil {
		t.Fatal(err)
	}
	if err := env.Sessions.End(ctx, sid, "t1", omni.StatusCompleted); err != nil {
		t.Fatal(err)
	}
}

// tracer is a durable consumer under the tracer's name that acknowledges
// the Trace classes up to the stream's end when told.
func tracer(t *testing.T, env *bustest.Env) func() {
	t.Helper()
	ctx := context.Background()
	var filters []string
	for _, c := range omni.TraceClasses {
		filters = append(filters, omni.SessionSubject("*", c))
	}
	cons, err := env.JS.CreateOrUpdateConsumer(ctx, omni.SessionsStream, jetstream.ConsumerConfig{
		Durable: DefaultTracer, FilterSubjects: filters, AckPolicy: jetstream.AckAllPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		batch, err := cons.FetchNoWait(int(info.NumPending))
		if err != nil {
			t.Fatal(err)
		}
		var last jetstream.Msg
		for m := range batch.Messages() {
			last = m
		}
		if last != nil {
			if err := last.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func idlePurger(env *bustest.Env, records IdleRecords) *Purger {
	p := New(env.JS, -1, zerolog.Nop())
	p.SetIdle(Idle{Keep: 0, Records: records})
	return p
}

// An idle Session leaves the stream only once the tracer has acknowledged
// its Trace-class messages, and the record names what was purged before
// the purge.
func TestIdlePurgeWaitsForTheTracer(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	ctx := context.Background()
	const sid = "idle1"
	idleSession(t, env, sid)
	p := idlePurger(env, env.Sessions)
	before := bustest.Held(t, env.JS, sid)

	// No tracer consumer at all: nothing is purged, a check is due later.
	if again := p.session(ctx, sid); again.IsZero() {
		t.Fatal("no tracer: the check gave up instead of trying again later")
	}
	// A tracer that has written nothing of it yet.
	ack := tracer(t, env)
	if again := p.session(ctx, sid); again.IsZero() {
		t.Fatal("tracer behind: the check gave up instead of trying again later")
	}
	if n := bustest.Held(t, env.JS, sid); n != before {
		t.Fatalf("purged before the tracer wrote the Session: %d of %d messages left", n, before)
	}
	if r, _, _ := env.Sessions.Get(ctx, sid); r.PurgedThrough != 0 {
		t.Fatalf("record says purged through %d before the tracer wrote the Session", r.PurgedThrough)
	}
	// The tracer catches up: every message of the Session goes.
	ack()
	last, err := bus.LastStored(ctx, env.JS, omni.SessionWildcard(sid))
	if err != nil || last == 0 {
		t.Fatalf("last message: %d, %v", last, err)
	}
	if again := p.session(ctx, sid); !again.IsZero() {
		t.Fatal("the check wants to try again after the tracer caught up")
	}
	if n := bustest.Held(t, env.JS, sid); n != 0 {
		t.Fatalf("%d messages of the idle Session left, want none", n)
	}
	if r, _, _ := env.Sessions.Get(ctx, sid); r.PurgedThrough != last {
		t.Fatalf("record says purged through %d, want the Session's last message %d", r.PurgedThrough, last)
	}
}

// beginFirst begins a Task of the Session right before the Purger's
// compare-and-set, as a Task submitted at that moment would.
type beginFirst struct {
	*bus.Sessions
	t *testing.T
}

func (b beginFirst) SetAt(ctx context.Context, r *omni.SessionRecord, rev uint64) error {
	if _, err := b.Sessions.Begin(ctx, r.ID, omni.StateRunning, "t2"); err != nil {
		b.t.Fatal(err)
	}
	return b.Sessions.SetAt(ctx, r, rev)
}

// A Session whose next Task began, before the check or during it, keeps
// every message.
func TestIdlePurgeNeverTouchesARunningTask(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	ctx := context.Background()
	ack := tracer(t, env)
	for i, sid := range []string{"running1", "racing1"} {
		idleSession(t, env, sid)
		ack()
		before := bustest.Held(t, env.JS, sid)
		records := IdleRecords(env.Sessions)
		if i == 0 {
			if _, err := env.Sessions.Begin(ctx, sid, omni.StateRunning, "t2"); err != nil {
				t.Fatal(err)
			}
		} else {
			records = beginFirst{env.Sessions, t}
		}
		p := idlePurger(env, records)
		p.session(ctx, sid)
		if n := bustest.Held(t, env.JS, sid); n != before {
			t.Errorf("%s: %d of %d messages left after its next Task began", sid, n, before)
		}
		if r, _, _ := env.Sessions.Get(ctx, sid); r.PurgedThrough != 0 || r.State != omni.StateRunning {
			t.Errorf("%s: record %s, purged through %d; want running, none", sid, r.State, r.PurgedThrough)
		}
	}
}
