package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

func TestLastStoredIsTheSubjectsLastSequence(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const sid = "session-2026-12-02-10-00-00-0123abcd"
	partial, model := omni.SessionSubject(sid, omni.ClassPartial), omni.SessionSubject(sid, omni.ClassModel)
	if n, err := bus.LastStored(ctx, env.JS, partial); err != nil || n != 0 {
		t.Fatalf("LastStored(nothing stored) = %d, %v; want 0", n, err)
	}
	var want uint64
	for _, subj := range []string{partial, model, partial, model} {
		ack, err := env.JS.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if subj == partial {
			want = ack.Sequence
		}
	}
	if n, err := bus.LastStored(ctx, env.JS, partial); err != nil || n != want {
		t.Fatalf("LastStored(partial) = %d, %v; want %d", n, err, want)
	}
}
