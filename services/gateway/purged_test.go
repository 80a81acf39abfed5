package gateway_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// A client whose Last-Event-ID is a partial that was purged since (its
// Task ended more than FLOE_PARTIALS_KEEP ago) gets the complete messages
// of the gap, in order, without resync_required: the partials of an ended
// Task are gone, its complete messages say everything they did.
func TestStreamIDInsidePurgedPartialsReplaysTheCompleteMessages(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	startEngine(t, env, func(e *fakeEngine) { e.Deltas = 20 })
	g := startGateway(t, env, "", nil)
	sess := createSession(t, g.Alice, client.CreateSession{})
	submit(t, g.Alice, sess.ID, "one")
	waitIdle(t, env, sess.ID)
	before := busStream(t, env, sess.ID)
	var partials []uint64
	for _, m := range before {
		var msg omni.Message
		if omni.Unmarshal([]byte(m.Data), &msg) == nil && msg.IsPartial() {
			partials = append(partials, m.Seq)
		}
	}
	if len(partials) < 20 {
		t.Fatalf("%d partials on the stream, want the Task's 20 deltas and more", len(partials))
	}
	stream, err := env.JS.Stream(ctxT(t), omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	// What the engine's purge does once the grace period has passed.
	if err := stream.Purge(ctxT(t), jetstream.WithPurgeSubject(omni.SessionSubject(sess.ID, omni.ClassPartial)), jetstream.WithPurgeSequence(partials[len(partials)-1]+1)); err != nil {
		t.Fatal(err)
	}
	after := busStream(t, env, sess.ID)
	if len(after) != len(before)-len(partials) {
		t.Fatalf("%d client-class messages after the purge, want %d", len(after), len(before)-len(partials))
	}
	epoch := stream.CachedInfo().Created.UnixMilli()
	mid := partials[len(partials)/2]
	s := openStream(t, g.Alice, sess.ID, fmt.Sprintf("%d-%d", epoch, mid))
	s.until("the snapshot", func(ev client.Event) bool { return ev.ID == "" && isTaskState(omni.StateIdle)(ev) })
	var want []streamed
	for _, m := range after {
		if m.Seq > mid {
			want = append(want, m)
		}
	}
	for _, ev := range s.got {
		if se, ok := serverEvent(ev); ok && se.Type == omni.ServerResyncRequired {
			t.Fatal("resync_required for an id inside the purged partials")
		}
	}
	if len(want) == 0 {
		t.Fatal("nothing after the purged id: the test shows nothing")
	}
	equalStreams(t, withIDs(t, s.got), want)
}
