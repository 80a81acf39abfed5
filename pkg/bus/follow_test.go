package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// publishN publishes n messages on each subject in turn and returns the
// sequences of those on the first.
func publishN(t *testing.T, ctx context.Context, env *bustest.Env, n int, subjects ...string) []uint64 {
	t.Helper()
	var seqs []uint64
	for i := range n {
		for j, subj := range subjects {
			ack, err := env.JS.Publish(ctx, subj, []byte(strconv.Itoa(i)))
			if err != nil {
				t.Fatal(err)
			}
			if j == 0 {
				seqs = append(seqs, ack.Sequence)
			}
		}
	}
	return seqs
}

func consumers(t *testing.T, ctx context.Context, env *bustest.Env) int {
	t.Helper()
	st, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

func TestFollowUntilCaughtUpReadsTheClassesFromASequence(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{Memory: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const sid = "session-2026-12-03-10-00-00-0001abcd"
	model, partial := omni.SessionSubject(sid, omni.ClassModel), omni.SessionSubject(sid, omni.ClassPartial)
	other := omni.SessionSubject("session-2026-12-03-10-00-00-0002abcd", omni.ClassModel)
	seqs := publishN(t, ctx, env, 5, model, partial, other)
	var got []uint64
	err := bus.Follow(ctx, env.JS, sid, []string{omni.ClassModel}, seqs[2], true, func(m bus.StreamMsg) error {
		if m.Class != omni.ClassModel || m.Subject != model {
			t.Errorf("message of class %q on %s, want model on %s", m.Class, m.Subject, model)
		}
		got = append(got, m.Seq)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(seqs[2:]) {
		t.Errorf("Follow from %d delivered %v, want %v", seqs[2], got, seqs[2:])
	}
	// Both classes, from the start (0 and 1 both mean the first retained).
	for _, start := range []uint64{0, 1} {
		n := 0
		if err := bus.Follow(ctx, env.JS, sid, nil, start, true, func(bus.StreamMsg) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if n != 10 {
			t.Errorf("Follow(all classes, start %d) delivered %d messages, want 10", start, n)
		}
	}
	// A Session with nothing stored returns at once.
	if err := bus.Follow(ctx, env.JS, "session-2026-12-03-10-00-00-0009abcd", nil, 0, true, func(m bus.StreamMsg) error {
		return fmt.Errorf("unexpected message %d", m.Seq)
	}); err != nil {
		t.Fatal(err)
	}
	bustest.Eventually(t, 10*time.Second, "no consumer left behind", func() bool { return consumers(t, ctx, env) == 0 })
}

func TestFollowEndsWithTheCallbacksErrorOrErrStop(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{Memory: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const sid = "session-2026-12-03-10-00-00-0003abcd"
	publishN(t, ctx, env, 20, omni.SessionSubject(sid, omni.ClassModel))
	boom := errors.New("boom")
	n := 0
	err := bus.Follow(ctx, env.JS, sid, nil, 0, false, func(bus.StreamMsg) error {
		if n++; n == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || n != 3 {
		t.Errorf("Follow = %v after %d calls, want boom after 3", err, n)
	}
	n = 0
	if err := bus.FollowUntil(ctx, env.JS, sid, nil, 0, false, func(bus.StreamMsg) error {
		if n++; n == 5 {
			return bus.ErrStop
		}
		return nil
	}); err != nil || n != 5 {
		t.Errorf("FollowUntil = %v after %d calls, want nil after 5", err, n)
	}
	// Its context ending ends a live Follow with the context's error.
	fctx, stop := context.WithCancel(ctx)
	n = 0
	err = bus.Follow(fctx, env.JS, sid, nil, 0, false, func(bus.StreamMsg) error {
		if n++; n == 20 {
			stop()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Follow after its context ended = %v, want context.Canceled", err)
	}
	bustest.Eventually(t, 10*time.Second, "no consumer left behind", func() bool { return consumers(t, ctx, env) == 0 })
}

// A live Follow sees what is published after it started, and goes on
// without a gap or a repeat when its consumer is deleted under it (a
// Tail replaces it).
func TestFollowLiveSurvivesTheDeletionOfItsConsumer(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{Memory: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const sid = "session-2026-12-03-10-00-00-0004abcd"
	subject := omni.SessionSubject(sid, omni.ClassEvent)
	want := publishN(t, ctx, env, 3, subject)
	var mu sync.Mutex
	var got []uint64
	delivered := func() []uint64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]uint64(nil), got...)
	}
	done := make(chan error, 1)
	go func() {
		done <- bus.FollowUntil(ctx, env.JS, sid, nil, 0, false, func(m bus.StreamMsg) error {
			mu.Lock()
			got = append(got, m.Seq)
			n := len(got)
			mu.Unlock()
			if n == 6 {
				return bus.ErrStop
			}
			return nil
		})
	}()
	bustest.Eventually(t, 20*time.Second, "the stored messages", func() bool { return len(delivered()) == 3 })
	st, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	for names := st.ConsumerNames(ctx); ; {
		name, ok := <-names.Name()
		if !ok {
			break
		}
		if err := env.JS.DeleteConsumer(ctx, omni.SessionsStream, name); err != nil {
			t.Fatal(err)
		}
	}
	want = append(want, publishN(t, ctx, env, 3, subject)...)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("Follow did not end; delivered %v, want %v", delivered(), want)
	}
	if g := delivered(); fmt.Sprint(g) != fmt.Sprint(want) {
		t.Errorf("delivered %v, want %v", g, want)
	}
}

func TestScanRunsCreatedBeforeAnyDelivery(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{Memory: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const sid = "session-2026-12-03-10-00-00-0005abcd"
	publishN(t, ctx, env, 4, omni.SessionSubject(sid, omni.ClassModel))
	created, n := false, 0
	err := bus.Scan(ctx, env.JS, sid, nil, 0, func() error {
		if n != 0 {
			t.Errorf("created ran after %d deliveries", n)
		}
		created = true
		return nil
	}, func(bus.StreamMsg) error {
		if !created {
			t.Error("a delivery before created")
		}
		n++
		return nil
	})
	if err != nil || n != 4 {
		t.Fatalf("Scan = %v with %d messages, want nil with 4", err, n)
	}
	refused := errors.New("refused")
	if err := bus.Scan(ctx, env.JS, sid, nil, 0, func() error { return refused }, func(bus.StreamMsg) error {
		t.Error("a delivery after created failed")
		return nil
	}); !errors.Is(err, refused) {
		t.Errorf("Scan with a failing created = %v, want its error", err)
	}
}

// A read until caught up ends when the messages it had still to get are
// purged under it (an idle Session's purge, a retention): the last message
// it got said more were pending, and none will come.
func TestFollowUntilCaughtUpEndsWhenTheRestIsPurged(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{Memory: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const sid = "session-2026-12-04-10-00-00-0001abcd"
	subj := omni.SessionSubject(sid, omni.ClassModel)
	const n = 3000
	publishN(t, ctx, env, n, subj)
	first, release := make(chan struct{}), make(chan struct{})
	got := 0
	done := make(chan error, 1)
	go func() {
		done <- bus.Follow(ctx, env.JS, sid, nil, 0, true, func(m bus.StreamMsg) error {
			if got == 0 {
				close(first)
				<-release // the rest is purged while the reader holds the first
			}
			if want := strconv.Itoa(got); string(m.Data) != want {
				return fmt.Errorf("message %d reads %q, want %q", got, m.Data, want)
			}
			got++
			return nil
		})
	}()
	select {
	case <-first:
	case <-ctx.Done():
		t.Fatal("no first message")
	}
	st, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(omni.SessionWildcard(sid))); err != nil {
		t.Fatal(err)
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Follow after the purge: %v (got %d)", err, got)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Follow still waiting 30 s after the purge (got %d of %d)", got, n)
	}
	if got >= n {
		t.Fatalf("got all %d messages: the purge came after every delivery, the test shows nothing", n)
	}
	bustest.Eventually(t, 10*time.Second, "no consumer left behind", func() bool { return consumers(t, ctx, env) == 0 })
}
