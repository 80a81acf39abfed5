package gwe2e

import (
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
	"floe.dev/services/gateway/client"
)

// An idle Session's messages leave the stream (FLOE_IDLE_KEEP) while
// another Session's older message stays, so the stream's first sequence
// does not move past them: an SSE client whose Last-Event-ID is inside
// the purged range gets resync_required, then the snapshot, as for an id
// the stream no longer retains; one that had everything gets no resync.
func TestPurgedSessionLastEventIDGetsResyncRequired(t *testing.T) {
	e := startWith(t, func(c *engine.Config) { c.SetIdleKeep(300 * time.Millisecond) })
	// A message of no Session the engine knows: nothing ever purges it.
	if _, err := e.st.JS.Publish(ctxT(t), omni.SessionSubject("ghost", omni.ClassServer), []byte(`{"type":"other"}`)); err != nil {
		t.Fatal(err)
	}
	ref := script(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": "The first answer, in a few pieces.", "chunks": 6}}},
	}})
	sid := e.session(e.c, client.CreateSession{Model: ref})
	c0 := stream(t, e.c, sid, "")
	if ev := c0.next("the snapshot"); !isTaskState(ev, omni.StateIdle) {
		t.Fatalf("fresh connection's first event = %s, want task_state idle", label(ev))
	}
	task := submit(t, e.c, sid, "first")
	c0.until("the task's end", idleOf(task))
	c0.close()
	full := c0.got[1:]
	last := seqOf(t, lastIDOf(full))
	var purged uint64
	eventually(t, "the idle Session purged", func() bool {
		rec, _, err := e.st.Sessions.Get(ctxT(t), sid)
		if err != nil {
			t.Fatal(err)
		}
		purged = rec.PurgedThrough
		// Counted from the stream's state, not read: a read racing the
		// purge waits for messages it will never get.
		return purged >= last && bustest.Held(t, e.st.JS, sid) == 0
	})

	c := stream(t, e.c, sid, full[2].ID)
	first := c.next("resync_required")
	if se, ok := serverEv(first); !ok || se.Type != omni.ServerResyncRequired || first.ID != "" {
		t.Fatalf("Last-Event-ID %s in the purged range: first event = %s, want resync_required without id", full[2].ID, label(first))
	}
	if ev := c.next("the snapshot"); ev.ID != "" || !isTaskState(ev, omni.StateIdle) {
		t.Fatalf("second event = %s, want task_state idle without id", label(ev))
	}
	c.close()

	if purged == last {
		// The client saw the Session's last message: nothing it lacks
		// was purged.
		c := stream(t, e.c, sid, lastIDOf(full))
		if ev := c.next("the snapshot"); ev.ID != "" || !isTaskState(ev, omni.StateIdle) {
			t.Fatalf("Last-Event-ID at the purge's end: first event = %s, want task_state idle without id", label(ev))
		}
		c.close()
	}
}
