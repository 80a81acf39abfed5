package gateway_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

func deltaIndex(ev client.Event) int {
	if !isDelta(ev) {
		return -1
	}
	var m omni.Message
	omni.Unmarshal(ev.Data, &m)
	var i int
	if _, err := fmt.Sscanf(m.Payload.Text, "tok%d ", &i); err != nil {
		return -1
	}
	return i
}

// checkSnapshotPlacement checks that the id-less task_state snapshot of a
// reconnect comes right after the replayed gap: after delta held-1 and
// before delta held.
func checkSnapshotPlacement(t *testing.T, evs []client.Event, held int) {
	t.Helper()
	lastDelta := -1
	for _, ev := range evs {
		if d := deltaIndex(ev); d >= 0 {
			lastDelta = d
		}
		if ev.ID == "" && isTaskState(omni.StateRunning)(ev) {
			if lastDelta != held-1 {
				t.Fatalf("snapshot after delta %d, want right after delta %d (end of the replayed gap)", lastDelta, held-1)
			}
			return
		}
	}
	t.Fatal("no task_state snapshot after the reconnect")
}

func TestStreamReconnectMidAnswerReplaysGapWithoutLossOrDuplicate(t *testing.T) {
	for _, mode := range []string{"same gateway, automatic reconnect", "restarted gateway", "second gateway"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			env := newBus(t)
			const held = 25
			g := newGate(held)
			startEngine(t, env, func(e *fakeEngine) { e.Deltas = 40; e.Hold = g.hold })
			a := startGateway(t, env, "", nil)
			sess := createSession(t, a.Alice, client.CreateSession{})

			s1 := openStream(t, a.Alice, sess.ID, "")
			first := s1.next()
			if first.ID != "" || !isTaskState(omni.StateIdle)(first) {
				t.Fatalf("first event = %q %s, want the task_state idle snapshot without id", first.ID, first.Data)
			}
			submit(t, a.Alice, sess.ID, "hello")
			s1.until("delta 10", func(ev client.Event) bool { return deltaIndex(ev) == 10 })
			g.waitReached(t)

			var all []client.Event
			switch mode {
			case "same gateway, automatic reconnect":
				a.HTTP.CloseClientConnections()
				eventually(t, "reconnect", func() bool { return s1.s.Connects() >= 2 })
				mark := len(s1.got)
				s1.until("snapshot", func(ev client.Event) bool { return ev.ID == "" && isTaskState(omni.StateRunning)(ev) })
				g.open()
				s1.until("task end", idleEvent)
				checkSnapshotPlacement(t, s1.got[mark:], held)
				all = s1.got
			default:
				lastID := s1.got[len(s1.got)-1].ID
				s1.close()
				target := a
				if mode == "restarted gateway" {
					a.swap(t)
				} else {
					target = startGateway(t, env, a.Home, nil)
				}
				s2 := openStream(t, target.Alice, sess.ID, lastID)
				if ev := s2.next(); ev.ID == "" || seqOf(t, ev.ID) <= seqOf(t, lastID) {
					t.Fatalf("first event after reconnect = %q, want the replayed gap after %s", ev.ID, lastID)
				}
				s2.until("snapshot", func(ev client.Event) bool { return ev.ID == "" })
				checkSnapshotPlacement(t, s2.got, held)
				g.open()
				s2.until("task end", idleEvent)
				all = append(append([]client.Event{}, s1.got...), s2.got...)
			}
			equalStreams(t, withIDs(t, all), busStream(t, env, sess.ID))
		})
	}
}

func TestStreamStaleIDGetsResyncFirst(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	startEngine(t, env, nil)
	g := startGateway(t, env, "", nil)
	sess := createSession(t, g.Alice, client.CreateSession{})
	submit(t, g.Alice, sess.ID, "one")
	waitIdle(t, env, sess.ID)
	all := busStream(t, env, sess.ID)
	stream, err := env.JS.Stream(ctxT(t), omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	epoch := info.Created.UnixMilli()
	id := func(seq uint64) string { return fmt.Sprintf("%d-%d", epoch, seq) }

	// A retained id replays the rest, then the snapshot.
	s := openStream(t, g.Alice, sess.ID, id(all[1].Seq))
	if ev := s.next(); ev.ID != id(all[2].Seq) {
		t.Fatalf("first replayed event = %q, want %q", ev.ID, id(all[2].Seq))
	}
	s.close()

	// Shrink retention: everything below the last message is gone.
	if err := stream.Purge(ctxT(t), jetstream.WithPurgeSequence(all[len(all)-1].Seq)); err != nil {
		t.Fatal(err)
	}
	for name, lastID := range map[string]string{
		"evicted seq":  id(all[1].Seq),
		"other epoch":  fmt.Sprintf("%d-%d", epoch-1, all[len(all)-1].Seq),
		"future seq":   id(info.State.LastSeq + 1000),
		"malformed id": "not-an-id",
	} {
		s := openStream(t, g.Alice, sess.ID, lastID)
		ev := s.next()
		se, ok := serverEvent(ev)
		if !ok || se.Type != omni.ServerResyncRequired || ev.ID != "" {
			t.Fatalf("%s: first event = %q %s %s, want resync_required without id", name, ev.ID, ev.Event, ev.Data)
		}
		if ev := s.next(); ev.ID != "" || !isTaskState(omni.StateIdle)(ev) {
			t.Fatalf("%s: second event = %q %s, want the task_state snapshot", name, ev.ID, ev.Data)
		}
		s.close()
	}

	// After resync the stream is live from now.
	s = openStream(t, g.Alice, sess.ID, id(all[1].Seq))
	s.until("resync", func(ev client.Event) bool {
		se, ok := serverEvent(ev)
		return ok && se.Type == omni.ServerResyncRequired
	})
	s.until("snapshot", func(ev client.Event) bool { return ev.ID == "" && isTaskState(omni.StateIdle)(ev) })
	submit(t, g.Alice, sess.ID, "two")
	ev := s.until("live event", func(ev client.Event) bool { return ev.ID != "" })
	if seqOf(t, ev.ID) <= all[len(all)-1].Seq {
		t.Fatalf("live event %s is not after the resync point %d", ev.ID, all[len(all)-1].Seq)
	}
}

func TestStreamFreshConnectionStartsWithTaskState(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := newGate(2)
	startEngine(t, env, func(e *fakeEngine) { e.Hold = g.hold })
	gw := startGateway(t, env, "", nil)
	sess := createSession(t, gw.Alice, client.CreateSession{})
	submit(t, gw.Alice, sess.ID, "hi")
	g.waitReached(t)
	s := openStream(t, gw.Alice, sess.ID, "")
	if ev := s.next(); ev.ID != "" || !isTaskState(omni.StateRunning)(ev) {
		t.Fatalf("first event = %q %s, want task_state running without id", ev.ID, ev.Data)
	}
	g.open()
	// Live only: the first delta seen is the one after the gate.
	ev := s.until("delta", isDelta)
	if d := deltaIndex(ev); d != 2 {
		t.Fatalf("first live delta = %d, want 2 (a fresh connection replays nothing)", d)
	}
	s.until("end", idleEvent)
}

func TestAlwaysAskApprovalFlow(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	fe := startEngine(t, env, func(e *fakeEngine) { e.Tool = true })
	g := startGateway(t, env, "", nil)
	sess := createSession(t, g.Alice, client.CreateSession{ApprovalMode: omni.ApproveAlwaysAsk})
	s1 := openStream(t, g.Alice, sess.ID, "")
	// The gateway reads a connection's snapshot after answering its
	// request: wait for it, so the approval asked below reaches s1 live
	// (with an id), not as part of a snapshot read late.
	if ev := s1.next(); ev.ID != "" || !isTaskState(omni.StateIdle)(ev) {
		t.Fatalf("first event = %q %s, want the task_state idle snapshot without id", ev.ID, ev.Data)
	}
	submit(t, g.Alice, sess.ID, "read a.txt")
	req := s1.until("approval_request", func(ev client.Event) bool {
		se, ok := serverEvent(ev)
		return ok && se.Type == omni.ServerApprovalRequest
	})
	if req.ID == "" {
		t.Fatal("live approval_request has no id")
	}
	se, _ := serverEvent(req)
	call, err := omni.Decode(se.ToolCall)
	if err != nil || call.Payload.ToolCallID != "call-1" {
		t.Fatalf("toolCall = %s (%v), want the tool_call call-1", se.ToolCall, err)
	}

	// A fresh connection and a resumed one both get it again, without id,
	// right after the task_state snapshot.
	for _, lastID := range []string{"", req.ID} {
		s := openStream(t, g.Alice, sess.ID, lastID)
		if ev := s.next(); ev.ID != "" || !isTaskState(omni.StateRunning)(ev) {
			t.Fatalf("last id %q: first event %q %s, want task_state running", lastID, ev.ID, ev.Data)
		}
		ev := s.next()
		got, ok := serverEvent(ev)
		if !ok || got.Type != omni.ServerApprovalRequest || ev.ID != "" || string(got.ToolCall) != string(se.ToolCall) {
			t.Fatalf("last id %q: second event %q %s, want the pending approval_request re-sent", lastID, ev.ID, ev.Data)
		}
		s.close()
	}

	ctx := ctxT(t)
	if err := g.Alice.Approve(ctx, sess.ID, "call-unknown", "allow"); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("approve unknown call: %v, want 404 not_found", err)
	}
	if err := g.Alice.Approve(ctx, sess.ID, "call-1", "maybe"); !client.IsCode(err, omni.CodeBadRequest) {
		t.Fatalf("approve with decision maybe: %v, want 400 bad_request", err)
	}
	if err := g.Bob.Approve(ctx, sess.ID, "call-1", "allow"); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("approve another principal's session: %v, want 404", err)
	}
	for _, body := range []string{`{"decision":"deny","scope":"session"}`, `{"decision":"allow","scope":"forever"}`} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/api/sessions/"+sess.ID+"/approvals/call-1", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("approve %s: %d, want 400", body, resp.StatusCode)
		}
	}
	// Allowed for the rest of the Session: the engine gets the scope.
	if err := g.Alice.AllowForSession(ctx, sess.ID, "call-1"); err != nil {
		t.Fatalf("approve: %v", err)
	}
	fe.mu.Lock()
	scopes := slices.Clone(fe.scopes)
	fe.mu.Unlock()
	if !slices.Contains(scopes, omni.ScopeSession) {
		t.Fatalf("the engine got scopes %q, want session", scopes)
	}
	dec := s1.until("approval_decision", func(ev client.Event) bool { return payloadType(ev.Data) == omni.TypeApprovalDecision })
	var m omni.Message
	omni.Unmarshal(dec.Data, &m)
	if m.Payload.Decision != "allow" {
		t.Fatalf("decision = %s", dec.Data)
	}
	s1.until("end", idleEvent)
	if err := g.Alice.Approve(ctx, sess.ID, "call-1", "allow"); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("approve after the task: %v, want 404", err)
	}
	equalStreams(t, withIDs(t, s1.got), busStream(t, env, sess.ID))
}

func TestManyClientsPerSessionSeeTheSameStream(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	startEngine(t, env, func(e *fakeEngine) { e.Deltas = 100 })
	g := startGateway(t, env, "", nil)
	sess := createSession(t, g.Alice, client.CreateSession{})
	var cols []*collector
	for range 5 {
		c := openStream(t, g.Alice, sess.ID, "")
		c.next() // snapshot
		cols = append(cols, c)
	}
	submit(t, g.Alice, sess.ID, "go")
	want := busStreamAfter(t, env, sess.ID, cols)
	for i, c := range cols {
		got := withIDs(t, c.got)
		if len(got) != len(want) {
			t.Fatalf("client %d: %d events, want %d", i, len(got), len(want))
		}
		equalStreams(t, got, want)
	}
}

// busStreamAfter waits until every collector saw the Task end and returns
// the bus's stream.
func busStreamAfter(t *testing.T, env *bustest.Env, sid string, cols []*collector) []streamed {
	t.Helper()
	for _, c := range cols {
		c.until("end", idleEvent)
	}
	return busStream(t, env, sid)
}
