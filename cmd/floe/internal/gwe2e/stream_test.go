package gwe2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// A streaming answer read by one client over four connections: a reconnect
// to the same gateway with Last-Event-ID, the client's own automatic
// reconnect across a restart of the gateway it reads from (stopped alone,
// another started on the same port and bus), and a resume on a second
// gateway replica. Joined, the events with ids are exactly the Session's
// client stream on JetStream: no gap, no duplicate, bytes verbatim.
func TestStreamResumesAcrossReconnectRestartAndReplica(t *testing.T) {
	e := start(t)
	answer := longText("word", 120)
	ref := script(t, obj{"requests": []any{
		obj{"steps": []any{
			obj{"thinking": "Let me answer at length.", "chunks": 4},
			obj{"text": answer, "chunks": 120, "delay_ms": 15},
		}},
	}})
	sid := e.session(e.c, client.CreateSession{Model: ref})

	// A fresh connection: task_state comes first, without an id.
	c0 := stream(t, e.c, sid, "")
	if ev := c0.next("the snapshot"); ev.ID != "" || !isTaskState(ev, omni.StateIdle) {
		t.Fatalf("fresh connection's first event = %s, want task_state idle without id", label(ev))
	}
	task := submit(t, e.c, sid, "tell me a long story")
	seen := func(evs ...[]client.Event) int {
		n := 0
		for _, l := range evs {
			n += count(l, func(ev client.Event) bool { return ev.ID != "" && isTextPartial(ev) })
		}
		return n
	}
	c0.until("20 text fragments", func(client.Event) bool { return seen(c0.got) >= 20 })
	last := c0.lastID()

	// Resume on another gateway, which is then restarted under the client.
	gB := e.startGateway("")
	c1 := stream(t, gB.c, sid, last)
	c1.until("50 text fragments", func(client.Event) bool { return seen(c0.got, c1.got) >= 50 })
	gB.stop()
	gB2 := e.startGateway(gB.addr)
	c1.until("80 text fragments", func(client.Event) bool { return seen(c0.got, c1.got) >= 80 })
	if n := c1.s.Connects(); n < 2 {
		t.Fatalf("the client connected %d times to the restarted gateway, want a reconnect", n)
	}
	last = c1.lastID()
	gB2.stop()

	// Resume on a second replica (the stack's gateway still runs too).
	gC := e.startGateway("")
	c2 := stream(t, gC.c, sid, last)
	c2.until("the task's end", idleOf(task))
	c2.close()

	all := append(append(append([]client.Event(nil), c0.got...), c1.got...), c2.got...)
	t.Logf("events per hop: %d, %d (over %d connections), %d", len(c0.got), len(c1.got), c1.s.Connects(), len(c2.got))
	want := e.busMsgs(sid, omni.ClientClasses, untilIdle(task))
	sameAsBus(t, all, want)
	var text strings.Builder
	for _, ev := range all {
		if m, ok := msgOf(ev); ok && m.Payload.Type == omni.TypePartialText {
			text.WriteString(m.Payload.Text)
		}
	}
	if text.String() != answer {
		t.Fatalf("the text fragments the client got concatenate to %q, want %q", text.String(), answer)
	}
	// Every resumed connection put the snapshot right after its replay:
	// the id-less events are task_state snapshots only.
	for _, ev := range all {
		if ev.ID == "" && !isTaskState(ev, "") {
			t.Fatalf("id-less event %s, want only task_state snapshots", label(ev))
		}
	}
}

// Where the snapshot goes, and what a stale Last-Event-ID gets: a fresh
// connection starts with task_state; a resume gets the gap replayed, then
// the snapshot; an id whose sequence left retention (the stream purged
// below a later sequence), an id of another stream incarnation or a
// malformed id gets resync_required first, then the snapshot, then live.
func TestStaleLastEventIDGetsResyncRequired(t *testing.T) {
	e := start(t)
	ref := script(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": "The first answer, in a few pieces.", "chunks": 6}}},
		obj{"steps": []any{obj{"text": "The second answer.", "chunks": 3}}},
	}})
	sid := e.session(e.c, client.CreateSession{Model: ref})
	c0 := stream(t, e.c, sid, "")
	// Read before submitting: the snapshot is read once the connection is
	// open, so a Task submitted meanwhile may already show in it.
	if ev := c0.next("the snapshot"); !isTaskState(ev, omni.StateIdle) || ev.ID != "" {
		t.Fatalf("fresh connection's first event = %s, want task_state idle without id", label(ev))
	}
	task := submit(t, e.c, sid, "first")
	c0.until("the first task's end", idleOf(task))
	c0.close()
	full := c0.got[1:]
	sameAsBus(t, full, e.busMsgs(sid, omni.ClientClasses, untilIdle(task)))

	// Resume after the third event: the rest is replayed, then the snapshot.
	from := full[2].ID
	c1 := stream(t, e.c, sid, from)
	snap := c1.until("the snapshot", func(ev client.Event) bool { return ev.ID == "" })
	if !isTaskState(snap, omni.StateIdle) {
		t.Fatalf("after the replay came %s, want task_state idle", label(snap))
	}
	replayed := c1.got[:len(c1.got)-1]
	if len(replayed) != len(full)-3 {
		t.Fatalf("replayed %d events after %s, want %d:%s", len(replayed), from, len(full)-3, describe(replayed))
	}
	sameAsBus(t, replayed, e.busMsgs(sid, omni.ClientClasses, untilIdle(task))[3:])
	c1.close()

	// Shrink retention: purge FLOE_SESSIONS below the last message, once
	// the tracer has what the next Task's context needs.
	lastSeq := seqOf(t, lastIDOf(full))
	trace := busAll(t, e.st.JS, sid, omni.TraceClasses)
	waitTracer(t, e.home, sid, trace[len(trace)-1].Seq)
	st, err := e.st.JS.Stream(ctxT(t), omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctxT(t), jetstream.WithPurgeSequence(lastSeq)); err != nil {
		t.Fatal(err)
	}
	epoch, _ := parseID(t, from)
	for _, stale := range []string{from, "1-" + strings.SplitN(from, "-", 2)[1], "not-an-id", jsonNum(epoch) + "-999999"} {
		c := stream(t, e.c, sid, stale)
		first := c.next("resync_required")
		if se, ok := serverEv(first); !ok || se.Type != omni.ServerResyncRequired || first.ID != "" {
			t.Fatalf("Last-Event-ID %q: first event = %s, want resync_required without id", stale, label(first))
		}
		if ev := c.next("the snapshot"); ev.ID != "" || !isTaskState(ev, omni.StateIdle) {
			t.Fatalf("Last-Event-ID %q: second event = %s, want task_state idle without id", stale, label(ev))
		}
		if stale != from {
			c.close()
			continue
		}
		// Then live: the next Task's events, all after the purge point.
		task2 := submit(t, e.c, sid, "second")
		c.until("the second task's end", idleOf(task2))
		c.close()
		for _, ev := range c.got[2:] {
			if ev.ID == "" || seqOf(t, ev.ID) <= lastSeq {
				t.Fatalf("after resync: %s, want live events after seq %d", label(ev), lastSeq)
			}
		}
		if se, _ := serverEv(c.got[len(c.got)-1]); se.Status != omni.StatusCompleted {
			t.Fatalf("second task ended %q:%s", se.Status, describe(c.got))
		}
	}
}

func jsonNum(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
