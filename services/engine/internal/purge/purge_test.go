package purge_test

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
	"floe.dev/services/engine/internal/purge"
)

// publish stores one message of the Session's class and returns its
// sequence.
func publish(t *testing.T, env *bustest.Env, sid string, m omni.Message) uint64 {
	t.Helper()
	nm, err := bus.SessionMsg(sid, &m, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := env.JS.PublishMsg(ctx, &nats.Msg{Subject: nm.Subject, Data: nm.Data, Header: nm.Header})
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// task runs a Task's claim, deltas and closing message on the Session
// record and the stream, and ends it unless running.
func task(t *testing.T, env *bustest.Env, sid, taskID string, running bool) {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Sessions.Begin(ctx, sid, omni.StateRunning, taskID); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		publish(t, env, sid, omni.Partial(omni.TypeText, omni.EventDelta, "piece ", "", ""))
	}
	publish(t, env, sid, omni.Text(omni.RoleAssistant, "piece piece piece piece piece"))
	if !running {
		if err := env.Sessions.End(ctx, sid, taskID, omni.StatusCompleted); err != nil {
			t.Fatal(err)
		}
	}
}

// count is how many messages the Session has on class.
func count(t *testing.T, env *bustest.Env, sid, class string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	subject := omni.SessionSubject(sid, class)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// An engine that stops with purges pending leaves them in no store: the
// next engine finds them from the stream. Sessions whose Tasks ended have
// every partial purged a grace period after their last one, the complete
// messages stay, and a Session whose Task still runs keeps its partials.
func TestPendingPurgesSurviveAnEngineRestart(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended, running := "ended1", "running1"
	for _, sid := range []string{ended, running} {
		if err := env.Sessions.Create(ctx, &omni.SessionRecord{ID: sid, Model: "scripted:demo", State: omni.StateIdle}); err != nil {
			t.Fatal(err)
		}
	}
	task(t, env, ended, "t1", false)
	task(t, env, ended, "t2", false)
	task(t, env, running, "t3", true)

	// The engine that ran them stopped before the grace period passed:
	// its Purger is gone with what it held. The next one starts.
	const keep = 500 * time.Millisecond
	p := purge.New(env.JS, keep, zerolog.Nop())
	n, err := p.Recover(ctx, env.Sessions)
	if err != nil || n != 1 {
		t.Fatalf("Recover = %d, %v; want 1 Session (the one whose Tasks ended), nil", n, err)
	}
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	bustest.Eventually(t, 20*time.Second, "the ended Tasks' partials purged", func() bool {
		return count(t, env, ended, omni.ClassPartial) == 0
	})
	if waited := time.Since(start); waited < keep/2 {
		t.Errorf("purged %v after the restart, want about the grace period %v after the last partial", waited, keep)
	}
	if got := count(t, env, ended, omni.ClassModel); got != 2 {
		t.Errorf("ended Session keeps %d complete messages, want 2", got)
	}
	// Only the ended Session was scheduled (n == 1): the running one
	// keeps every partial.
	if got := count(t, env, running, omni.ClassPartial); got != 5 {
		t.Errorf("running Task's partials: %d left, want all 5", got)
	}
}
