package consume_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/tracer/internal/consume"
	tt "floe.dev/services/tracer/internal/tracertest"
)

// The shared position table refuses one Session's position (a write
// error of the table): the tracer does not stop. That Session is set
// aside (reported stuck, the refusals counted) while the others are
// traced, its position is retried with backoff, and once the table takes
// it again its Trace catches up with every record, in order, nothing
// twice. The loop never stops.
func TestAPositionWriteErrorDoesNotStopTheTracer(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	const bad = "session-2026-11-29-20-10-22-0000bad1"
	const good = "session-2026-11-29-20-10-22-00009001"
	var refusing atomic.Bool
	var refused atomic.Int64
	var mu sync.Mutex
	var stuck []consume.Stuck
	o := options(home)
	o.RetryMin, o.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	o.Hooks.FailPositions = func(sid string) error {
		if sid == bad && refusing.Load() {
			return errors.New("position table: no space left on device")
		}
		return nil
	}
	o.PositionFailed = func(n int) { refused.Add(int64(n)) }
	o.Stuck = func(s []consume.Stuck) {
		mu.Lock()
		stuck = s
		mu.Unlock()
	}
	run(t, env, o, zerolog.New(zerolog.NewTestWriter(t)))

	tt.Publish(t, env.JS, tt.Msg(t, bad, tt.Meta(bad)), tt.Msg(t, bad, omni.UserText("one")))
	tt.Publish(t, env.JS, tt.Msg(t, good, tt.Meta(good)), tt.Msg(t, good, omni.UserText("one")))
	tt.WaitTrace(t, env.JS, home, good)
	before := tt.WaitTrace(t, env.JS, home, bad)
	// From now on the table refuses the position of bad (the records of
	// its next batch are appended, their position is not recorded).
	refusing.Store(true)
	tt.Publish(t, env.JS, tt.Msg(t, bad, omni.UserText("two")), tt.Msg(t, good, omni.UserText("two")))
	tt.WaitTrace(t, env.JS, home, good)

	if !tt.Poll(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(stuck) == 1 && stuck[0].SessionID == bad
	}) {
		t.Fatalf("the Session whose position was refused is not reported stuck: %+v", stuck)
	}
	// Retried with backoff: refused again, and again.
	if !tt.Poll(10*time.Second, func() bool { return refused.Load() >= 1 }) {
		t.Fatal("the refusal was not counted")
	}
	if p := tt.Pos(t, home, bad); p.Seq >= lastSeq(t, env, bad) || p.Size != int64(len(before)) {
		t.Fatalf("the refused Session's position %+v moved (recorded Trace: %d bytes)", p, len(before))
	}

	// The table takes it again: the Trace catches up, and the loop goes on.
	refusing.Store(false)
	tt.WaitTrace(t, env.JS, home, bad)
	if !tt.Poll(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(stuck) == 0
	}) {
		t.Fatalf("still reported stuck after catching up: %+v", stuck)
	}
	tt.Publish(t, env.JS, tt.Msg(t, bad, omni.UserText("three")), tt.Msg(t, good, omni.UserText("three")))
	tt.WaitTrace(t, env.JS, home, bad)
	tt.WaitTrace(t, env.JS, home, good)
}

// lastSeq is the sequence of the Session's last Trace record on the
// stream.
func lastSeq(t *testing.T, env *bustest.Env, sid string) uint64 {
	t.Helper()
	_, last := tt.Expected(t, env.JS, sid)
	return last
}
