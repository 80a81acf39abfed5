package bus_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// FLOE_SESSIONS takes more consumers than nats-server's default per-stream
// limit of 1000: every SSE client holds one.
func TestSessionsStreamAllowsManyConsumers(t *testing.T) {
	env := bustest.Start(t, bus.Config{Memory: true})
	ctx := context.Background()
	for i := 0; i < 1100; i++ {
		_, err := env.JS.OrderedConsumer(ctx, omni.SessionsStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{omni.SessionWildcard(fmt.Sprintf("s%d", i))},
		})
		if err != nil {
			t.Fatalf("consumer %d: %v", i, err)
		}
	}
}

// TestEnsureKeepsTheLiveLayoutsSettings: a start with setup on creates a
// missing layout, but never rewrites the retention of an existing one; it
// reports the disagreement, and turns on batched publishing when an older
// layout lacks it.
func TestEnsureKeepsTheLiveLayoutsSettings(t *testing.T) {
	env := bustest.Start(t, bus.Config{MaxAge: time.Hour})
	ctx := context.Background()
	cfg := bus.SessionsStreamConfig(bus.Config{MaxAge: time.Hour})
	cfg.AllowBatchPublish = false
	if _, err := env.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	_, diffs, err := bus.Ensure(ctx, env.JS, bus.Config{MaxAge: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	st, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	live := st.CachedInfo().Config
	if live.MaxAge != time.Hour || !live.AllowBatchPublish {
		t.Errorf("after Ensure: max_age %v, allow_batched %v; want 1h kept and batched publishing on", live.MaxAge, live.AllowBatchPublish)
	}
	found := false
	for _, d := range diffs {
		found = found || strings.Contains(d, "FLOE_SESSIONS max_age")
	}
	if !found {
		t.Errorf("differences %q do not report FLOE_SESSIONS max_age", diffs)
	}
}

// A layout Ensure made with settings left to the server (zero: the
// defaults floe chat and floe serve start with) agrees with the same
// settings the next time: no warning on a healthy start.
func TestEnsureDefaultsAgreeWithTheLiveLayout(t *testing.T) {
	for _, c := range []bus.Config{{}, {MaxAge: time.Minute}, {MaxAge: time.Hour, MaxBytes: 1 << 30}} {
		env := bustest.Start(t, c)
		_, diffs, err := bus.Ensure(context.Background(), env.JS, c)
		if err != nil {
			t.Fatal(err)
		}
		if len(diffs) != 0 {
			t.Errorf("Ensure(%+v) again reports %q", c, diffs)
		}
	}
}

// A home made before compression was on (FLOE_SESSIONS and the growing
// buckets stored plain) gets S2 compression in place when a service
// starts with setup on, and every message and record stays readable.
func TestEnsureTurnsOnCompressionInAnOlderHome(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	ctx := context.Background()
	rec := &omni.SessionRecord{ID: "old1", Model: "scripted:demo"}
	if err := env.Sessions.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	streams := []string{omni.SessionsStream, "KV_" + omni.SessionsBucket, "KV_" + omni.SnapshotsBucket}
	for _, name := range streams {
		st, err := env.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		if cfg.Compression != jetstream.S2Compression {
			t.Errorf("a new layout's %s compression = %v, want s2", name, cfg.Compression)
		}
		cfg.Compression = jetstream.NoCompression // as the previous release made it
		if _, err := env.JS.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		if _, err := env.JS.Publish(ctx, omni.SessionSubject("old1", omni.ClassModel), fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}

	if _, _, err := bus.Ensure(ctx, env.JS, bus.Config{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range streams {
		st, err := env.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if c := st.CachedInfo().Config.Compression; c != jetstream.S2Compression {
			t.Errorf("after Ensure %s compression = %v, want s2", name, c)
		}
	}
	st, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 100 {
		t.Errorf("FLOE_SESSIONS holds %d messages after Ensure, want 100", n)
	}
	if m, err := st.GetMsg(ctx, 50); err != nil || string(m.Data) != `{"n":49}` {
		t.Errorf("message 50 after Ensure = %v, %v", m, err)
	}
	if got, _, err := env.Sessions.Get(ctx, "old1"); err != nil || got.Model != rec.Model {
		t.Errorf("Session record after Ensure = %+v, %v", got, err)
	}
}
