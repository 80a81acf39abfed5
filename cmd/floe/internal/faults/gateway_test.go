package faults

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// One of two gateways is killed (SIGKILL) while an SSE client follows a
// running Session through it: the client reconnects to the other replica
// with its Last-Event-ID and, across both connections, receives every
// message of the Session's client stream exactly once, in stream order.
func TestGatewayKilledSSEResumesOnOtherReplica(t *testing.T) {
	c := newCluster(t, 1, 1)
	c.service("tracer", "tracer")
	c.service("toolrunner", "toolrunner")
	c.service("engine", "engine")
	var gws []*proc
	var urls []string
	for i := range 2 {
		port := freePort(t)
		gws = append(gws, c.service("gateway", fmt.Sprintf("gateway-%d", i+1), fmt.Sprintf("FLOE_HTTP_ADDR=127.0.0.1:%d", port)))
		urls = append(urls, fmt.Sprintf("http://127.0.0.1:%d", port))
	}
	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{text(strings.Repeat("Streaming through a gateway. ", 8), 40, 60), execCall("call_a", "sleep 0.3; echo tool")}},
		map[string]any{"steps": []any{text(strings.Repeat("And the rest of the answer. ", 4), 20, 60)}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gw1, gw2 := client.New(urls[0]), client.New(urls[1])
	sess, err := gw1.CreateSession(ctx, client.CreateSession{Model: ref, Workspace: c.ws})
	if err != nil {
		t.Fatal(err)
	}
	sid := sess.ID

	// The client follows gateway 1.
	ctx1, cancel1 := context.WithCancel(ctx)
	defer cancel1()
	s1, err := gw1.Stream(ctx1, sid, "", client.WithReconnectDelay(50*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw1.SubmitTask(ctx, sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "stream it"}}}); err != nil {
		t.Fatal(err)
	}
	var got []client.Event
	for ev := range s1.C {
		got = append(got, ev)
		if countIDs(got) == 15 {
			break
		}
	}
	gws[0].kill(t)
	// The dead replica cannot be reached again: stop this stream and take
	// every event it had already handed over.
	cancel1()
	for ev := range s1.C {
		got = append(got, ev)
	}
	last := lastID(got)
	if last == "" || s1.LastEventID() != last {
		t.Fatalf("last event id %q, stream says %q", last, s1.LastEventID())
	}
	cut := len(got)

	// Reconnect to gateway 2 with Last-Event-ID.
	s2, err := gw2.Stream(ctx, sid, last)
	if err != nil {
		t.Fatal(err)
	}
	done := false
	for ev := range s2.C {
		got = append(got, ev)
		if se, ok := serverEvent(ev); ok && se.Type == omni.ServerTaskState && se.State == omni.StateIdle && ev.ID != "" {
			done = true
			break
		}
	}
	cancel()
	for range s2.C {
	}
	if !done {
		t.Fatal("the second stream ended before the Task")
	}
	for _, ev := range got[cut:] {
		if se, ok := serverEvent(ev); ok && se.Type == omni.ServerResyncRequired {
			t.Fatal("gateway 2 sent resync_required for a retained Last-Event-ID")
		}
	}

	// Every id'd event, across both connections, is the client stream from
	// the first one on: same sequences, same bytes, nothing missing or twice.
	var want []rec
	first := seqOf(t, firstID(got))
	for _, r := range c.all(sid, omni.ClientClasses) {
		if r.seq >= first {
			want = append(want, r)
		}
	}
	var ided []client.Event
	for _, ev := range got {
		if ev.ID != "" {
			ided = append(ided, ev)
		}
	}
	lastSeq := seqOf(t, ided[len(ided)-1].ID)
	for len(want) > 0 && want[len(want)-1].seq > lastSeq {
		want = want[:len(want)-1]
	}
	if len(ided) != len(want) {
		t.Fatalf("client got %d events with ids, the stream has %d from seq %d to %d", len(ided), len(want), first, lastSeq)
	}
	for i, ev := range ided {
		if seqOf(t, ev.ID) != want[i].seq || string(ev.Data) != string(want[i].raw) {
			t.Fatalf("event %d: id %s %s, stream seq %d %s", i, ev.ID, ev.Data, want[i].seq, want[i].raw)
		}
	}
	t.Logf("%d events before the kill, %d after, on the other replica", countIDs(got[:cut]), countIDs(got[cut:]))
	c.checkIdle(sid, omni.StatusCompleted)
	checkSession(t, c.all(sid, nil), "stream it")
	c.noViolations()
}

func countIDs(evs []client.Event) int {
	n := 0
	for _, ev := range evs {
		if ev.ID != "" {
			n++
		}
	}
	return n
}

func lastID(evs []client.Event) string {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].ID != "" {
			return evs[i].ID
		}
	}
	return ""
}

func firstID(evs []client.Event) string {
	for _, ev := range evs {
		if ev.ID != "" {
			return ev.ID
		}
	}
	return ""
}

// seqOf returns the stream sequence of an SSE id <epoch>-<seq>.
func seqOf(t *testing.T, id string) uint64 {
	t.Helper()
	_, s, ok := strings.Cut(id, "-")
	n, err := strconv.ParseUint(s, 10, 64)
	if !ok || err != nil {
		t.Fatalf("malformed event id %q", id)
	}
	return n
}
