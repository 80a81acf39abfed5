package publish

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// A batch that failed keeps its ack subscription (the client library does
// not close it on every failure), so its handler can still report errors,
// e.g. the new leader refusing the rest of it as an unknown batch. Such a
// late error must not fail the batch opened after it (the owner's
// recovery, which would then be retried for nothing).
func TestALateErrorOfAnEarlierBatchDoesNotFailTheOpenOne(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	const sid = "session-2026-12-01-10-00-00-0123abcd"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := New(env.JS, Options{})
	defer p.Close()
	msg := func(s string) *nats.Msg {
		m := nats.NewMsg(omni.SessionSubject(sid, omni.ClassPartial))
		m.Data = []byte(s)
		return m
	}
	if err := p.Publish(ctx, msg("first batch")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctx, msg("second batch")); err != nil {
		t.Fatal(err)
	}
	// Once the second batch's first message is stored, that batch is
	// the open one.
	bustest.Eventually(t, 10*time.Second, "the second batch's first message", func() bool {
		st, err := env.JS.Stream(ctx, omni.SessionsStream)
		return err == nil && st.CachedInfo().State.Msgs == 2
	})
	p.onAsyncError(1, errors.New("unknown batch id (of the first batch, late)"))
	if err := p.Publish(ctx, msg("second batch, more")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Settle(ctx); err != nil {
		t.Fatalf("settle after a late error of an earlier batch: %v", err)
	}
}
