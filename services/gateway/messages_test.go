package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// completeOnBus returns the Session's Trace-class messages (meta, model,
// event) from the bus, with their sequences.
func completeOnBus(t *testing.T, env *bustest.Env, sid string) []streamed {
	t.Helper()
	var out []streamed
	err := bus.FollowUntil(ctxT(t), env.JS, sid, []string{omni.ClassMeta, omni.ClassModel, omni.ClassEvent}, 0, true, func(m bus.StreamMsg) error {
		out = append(out, streamed{m.Seq, string(m.Data)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writeTrace plays a lagging tracer: it writes the first n records to the
// Trace file and records the position after them.
func writeTrace(t *testing.T, home, sid string, recs []streamed, n int) {
	t.Helper()
	created, _ := omni.SessionCreated(sid)
	path := trace.File(home, created, sid, 1)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, r := range recs[:n] {
		b.WriteString(r.Data + "\n")
	}
	size := b.Len()
	// Bytes past the recorded size are unrecorded writes a reader ignores.
	b.WriteString(recs[n].Data + "\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := trace.WritePos(home, sid, trace.Pos{Seq: recs[n-1].Seq, File: path, Size: int64(size), Index: 1}); err != nil {
		t.Fatal(err)
	}
}

func TestMessagesWithLiveTaskMatchesTheStream(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	const held = 15
	g1 := newGate(held)
	var later atomic.Bool
	startEngine(t, env, func(e *fakeEngine) {
		e.Deltas = 30
		e.Hold = func(ctx context.Context, sid string, i int) {
			if later.Load() {
				g1.hold(ctx, sid, i)
			}
		}
	})
	g := startGateway(t, env, "", nil)
	ctx := ctxT(t)
	s := createSession(t, g.Alice, client.CreateSession{})

	// A finished Task, half written by a lagging tracer.
	submit(t, g.Alice, s.ID, "first")
	waitIdle(t, env, s.ID)
	later.Store(true)
	recs := completeOnBus(t, env, s.ID)
	writeTrace(t, g.Home, s.ID, recs, 4)
	m, err := g.Alice.Messages(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if m.Live != nil {
		t.Fatalf("live = %+v for an idle session", m.Live)
	}
	if len(m.Messages) != len(recs) {
		t.Fatalf("history has %d messages, want %d", len(m.Messages), len(recs))
	}
	for i := range recs {
		if string(m.Messages[i]) != recs[i].Data {
			t.Fatalf("history[%d] = %s, want %s", i, m.Messages[i], recs[i].Data)
		}
	}

	// Connect first, buffer, then fetch the history mid-answer.
	col := openStream(t, g.Alice, s.ID, "")
	submit(t, g.Alice, s.ID, "second")
	g1.waitReached(t)
	col.until("last delta before the gate", func(ev client.Event) bool { return deltaIndex(ev) == held-1 })
	m, err = g.Alice.Messages(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if m.Live == nil || len(m.Live.Fragments) != 1 {
		t.Fatalf("live = %+v, want one open text segment", m.Live)
	}
	frag, err := omni.Decode(m.Live.Fragments[0])
	if err != nil || frag.Payload.Type != omni.TypePartialText || frag.Payload.EventType != omni.EventStart {
		t.Fatalf("fragment %s (%v), want a partial_text start", m.Live.Fragments[0], err)
	}
	var sofar strings.Builder
	for i := range held {
		fmt.Fprintf(&sofar, "tok%d ", i)
	}
	if frag.Payload.Text != sofar.String() {
		t.Fatalf("fragment text %q, want %q", frag.Payload.Text, sofar.String())
	}
	g1.open()
	col.until("end", idleEvent)

	// Replay the buffered events the cursor does not cover.
	history := make([]string, len(m.Messages))
	for i, b := range m.Messages {
		history[i] = string(b)
	}
	text := frag.Payload.Text
	var final string
	cur := cursorSeq(t, m.Live)
	for _, ev := range col.got {
		if ev.ID != "" {
			// The cursor and the SSE ids share the stream's epoch.
			if e1, _, _ := client.ParseEventID(ev.ID); !strings.HasPrefix(m.Live.Cursor, fmt.Sprint(e1)+"-") {
				t.Fatalf("cursor %q and event id %q differ in epoch", m.Live.Cursor, ev.ID)
			}
		}
		if ev.ID == "" || ev.Event == client.EventServer || seqOf(t, ev.ID) <= cur {
			continue
		}
		msg, err := omni.Decode(ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		if msg.IsPartial() {
			text += msg.Payload.Text
			continue
		}
		history = append(history, string(ev.Data))
		if msg.Payload.Type == omni.TypeText && msg.Payload.Role == omni.RoleAssistant {
			final = msg.Payload.Text
		}
	}
	want := completeOnBus(t, env, s.ID)
	if len(history) != len(want) {
		t.Fatalf("rebuilt %d messages, want %d", len(history), len(want))
	}
	for i := range want {
		if history[i] != want[i].Data {
			t.Fatalf("message %d = %s, want %s", i, history[i], want[i].Data)
		}
	}
	if text != final || final == "" {
		t.Fatalf("fragment + deltas = %q, complete text = %q", text, final)
	}
}

func TestSlowClientIsDisconnectedOthersUnaffected(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	startEngine(t, env, func(e *fakeEngine) { e.Deltas = 200; e.DeltaBytes = 32 << 10 })
	g := startGateway(t, env, "", func(c *gateway.Config) {
		c.ClientBuffer = 16
		c.WriteTimeout = time.Second
	})
	s := createSession(t, g.Alice, client.CreateSession{})

	// A client that reads the headers and then nothing.
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /api/sessions/%s/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n", s.ID, aliceToken)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("slow client: %v %v", resp, err)
	}

	good := openStream(t, g.Alice, s.ID, "")
	submit(t, g.Alice, s.ID, "flood")
	good.until("end", idleEvent)
	if good.s.Connects() != 1 {
		t.Fatalf("the reading client reconnected %d times", good.s.Connects()-1)
	}
	equalStreams(t, withIDs(t, good.got), busStream(t, env, s.ID))

	eventually(t, "slow client disconnected", func() bool {
		return strings.Contains(metricsText(t, g), "floe_gateway_sse_slow_disconnects_total 1")
	})
	conn.SetReadDeadline(time.Now().Add(waitLimit))
	// The server ends the response, possibly mid-chunk (unexpected EOF).
	if _, err := io.Copy(io.Discard, resp.Body); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("slow client's connection was not closed: %v", err)
	}
}

func metricsText(t *testing.T, g *testGateway) string {
	req, _ := http.NewRequest("GET", g.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

var _ = json.Marshal

// GET /messages answers every record as the bytes the Trace holds (protocol.md
// §2): not compacted, and <, > and & not escaped, as encoding/json would.
func TestMessagesPassRecordsThroughAsStored(t *testing.T) {
	t.Parallel()
	g, ws := importEnv(t, nil)
	ctx := ctxT(t)
	lines := []string{
		metaLine(importSID, "openai", ws),
		`{"timestamp": "2026-07-18T03:10:23.000Z", "type": "model_msg", "payload": {"type": "text", "role": "user", "text": "keep <main> & <b>green</b> \u2028", "stop_reason": "completed"}}`,
	}
	if _, err := g.Alice.ImportTrace(ctx, client.ImportTrace{DataBase64: b64(strings.Join(lines, "\n") + "\n")}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, g.URL+"/api/sessions/"+importSID+"/messages", nil)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `{"messages":[` + strings.Join(lines, ",") + `],"positions":[0,1]}` + "\n"; err != nil || string(body) != want {
		t.Fatalf("messages = %s (%v), want %s", body, err, want)
	}
	if resp.ContentLength != int64(len(body)) || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("Content-Length %d for %d bytes, type %q", resp.ContentLength, len(body), resp.Header.Get("Content-Type"))
	}
}
