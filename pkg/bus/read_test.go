package bus_test

import (
	"context"
	"testing"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// TestHoldsFindsOnlyTheAskedClassesFromASequence: Holds answers whether a
// Session's messages of the given classes reach sequence from, counting
// neither other classes nor other Sessions.
func TestHoldsFindsOnlyTheAskedClassesFromASequence(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	ctx := context.Background()
	const sid, other = "session-2026-11-29-20-59-59-0123abcd", "session-2026-11-29-20-59-59-99999999"
	publish := func(sessionID, class string) uint64 {
		t.Helper()
		ack, err := env.JS.Publish(ctx, omni.SessionSubject(sessionID, class), []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	meta := publish(sid, omni.ClassMeta)
	model := publish(sid, omni.ClassModel)
	publish(sid, omni.ClassServer) // a task_state after the last record
	publish(other, omni.ClassModel)
	for _, tc := range []struct {
		classes []string
		from    uint64
		want    bool
	}{
		{omni.TraceClasses, meta, true},
		{omni.TraceClasses, model, true},
		{omni.TraceClasses, model + 1, false}, // only the server event and another Session follow
		{nil, model + 1, true},                // every class: the server event
		{[]string{omni.ClassMeta}, meta + 1, false},
		{[]string{omni.ClassEvent}, 1, false},
	} {
		got, err := bus.Holds(ctx, env.JS, sid, tc.classes, tc.from)
		if err != nil || got != tc.want {
			t.Errorf("Holds(%v, from %d) = %v, %v; want %v", tc.classes, tc.from, got, err, tc.want)
		}
	}
}
