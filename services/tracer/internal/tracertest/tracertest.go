// Package tracertest holds the tracer tests' fixtures: realistic Sessions
// to publish, and an oracle that derives a Session's expected Trace from
// what FLOE_SESSIONS actually stored.
package tracertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/tracer"
)

// Item is one message to publish: a subject and its body.
type Item struct {
	Subject string
	Data    []byte
}

// Msg is the Item that publishes m on its Session subject, as bus.SessionMsg
// routes it.
func Msg(t testing.TB, sid string, m omni.Message) Item {
	t.Helper()
	nm, err := bus.SessionMsg(sid, &m, "")
	if err != nil {
		t.Fatalf("SessionMsg: %v", err)
	}
	return Item{Subject: nm.Subject, Data: nm.Data}
}

// On is the Item that publishes m on an explicit class of the Session.
func On(t testing.TB, sid, class string, m omni.Message) Item {
	t.Helper()
	b, err := omni.Marshal(&m)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	return Item{Subject: omni.SessionSubject(sid, class), Data: b}
}

// Meta returns a session_meta for sid.
func Meta(sid string) omni.Message {
	return omni.SessionMeta(omni.Meta{SessionID: sid, Provider: "scripted", ModelID: "demo",
		ModelContextWindow: 200000, SystemPrompt: "You are Floe.", Workspace: "/work/ws"})
}

// Tools returns a tool_list_ready with one tool.
func Tools() omni.Message {
	return omni.ToolListReady([]omni.ToolSpec{{Name: "read_file", Description: "Read a file",
		Parameters: json.RawMessage(`{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}`)}})
}

// Turn returns one complete turn as the engine and a toolrunner publish
// it: request_begin, thinking, text and a tool call each streamed as
// partials then completed, the approval, the tool's output, token usage and
// request_end. n tells turns apart.
func Turn(t testing.TB, sid string, n int) []Item {
	t.Helper()
	id := "call_" + string(rune('a'+n%26))
	ms := []omni.Message{omni.RequestBegin()}
	ms = append(ms, streamed(omni.TypeThinking, "Let me look.", "", "")...)
	ms = append(ms, omni.Thinking("Let me look."))
	ms = append(ms, streamed(omni.TypeText, "Reading the file.", "", "")...)
	ms = append(ms, omni.Text(omni.RoleAssistant, "Reading the file."))
	ms = append(ms, streamed(omni.TypeToolCall, `{"file_path":"a.txt"}`, "read_file", id)...)
	ms = append(ms, omni.ToolCall("read_file", `{"file_path":"a.txt"}`, id))
	ms = append(ms, omni.ApprovalDecision(omni.DecisionAllow, id))
	ms = append(ms, streamed(omni.TypeToolCallOutput, "1\thello\n", "", id)...)
	ms = append(ms, omni.ToolCallOutput(id, "1\thello\n", ""))
	ms = append(ms, omni.TokenUsage(omni.Usage{Output: 10, Total: 110}, omni.Usage{Output: 10, Total: 110}))
	ms = append(ms, omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	items := make([]Item, len(ms))
	for i, m := range ms {
		items[i] = Msg(t, sid, m)
	}
	return items
}

func streamed(typ, content, name, id string) []omni.Message {
	half := len(content) / 2
	return []omni.Message{
		omni.Partial(typ, omni.EventStart, "", name, id),
		omni.Partial(typ, omni.EventDelta, content[:half], name, id),
		omni.Partial(typ, omni.EventDelta, content[half:], name, id),
		omni.Partial(typ, omni.EventStop, "", name, id),
	}
}

// Session returns a realistic Session: session_meta, tool_list_ready, the
// Prompt, one turn, a subagent pointer, then the child's messages forwarded
// on .nested, a server event on .server, an origin-tagged message published
// (wrongly) on .model, a hand-formatted record with unknown fields and
// escapes (written verbatim, never re-encoded), and a second turn.
func Session(t testing.TB, sid string) []Item {
	t.Helper()
	items := []Item{
		Msg(t, sid, Meta(sid)),
		Msg(t, sid, Tools()),
		Msg(t, sid, omni.UserText("Read a.txt, please.")),
	}
	items = append(items, Turn(t, sid, 0)...)
	child := "session-2026-11-29-20-10-23-0badcafe"
	items = append(items,
		Msg(t, sid, omni.Subagent(child)),
		Msg(t, sid, omni.Text(omni.RoleAssistant, "child says hi").WithOrigin(child)),
		Item{Subject: omni.SessionSubject(sid, omni.ClassServer), Data: []byte(`{"type":"task_state","state":"running"}`)},
		On(t, sid, omni.ClassModel, omni.Text(omni.RoleAssistant, "misrouted child").WithOrigin(child)),
		Item{Subject: omni.SessionSubject(sid, omni.ClassModel),
			Data: []byte(`{"timestamp":"2026-11-29T20:10:22.531Z", "type":"model_msg","payload":{"type":"text","role":"assistant","text":"caf\u00e9 \"ok\"","fidelity":{"b": 1,"a":[ ]},"x_future":true}}`)},
	)
	items = append(items, Turn(t, sid, 1)...)
	return items
}

// Publish publishes items synchronously, in order, and returns their
// stream sequences.
func Publish(t testing.TB, js jetstream.JetStream, items ...Item) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seqs := make([]uint64, len(items))
	for i, it := range items {
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: it.Subject, Data: it.Data})
		if err != nil {
			t.Fatalf("publish %s: %v", it.Subject, err)
		}
		seqs[i] = ack.Sequence
	}
	return seqs
}

// PublishAsync publishes items with async acks (order kept: one
// connection) and waits for every ack.
func PublishAsync(t testing.TB, js jetstream.JetStream, items ...Item) {
	t.Helper()
	// In windows of 1000, below the client's cap on outstanding publishes,
	// so a busy machine does not stall it.
	for len(items) > 0 {
		n := min(len(items), 1000)
		for _, it := range items[:n] {
			if _, err := js.PublishMsgAsync(&nats.Msg{Subject: it.Subject, Data: it.Data}); err != nil {
				t.Fatalf("publish %s: %v", it.Subject, err)
			}
		}
		items = items[n:]
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(60 * time.Second):
			t.Fatalf("async publish not acked within 60s")
		}
	}
}

// Expected is the oracle: the Session's Trace as the stream dictates it —
// its meta|model|event|trace messages in stream order that decode and
// validate, minus partials and origin-tagged ones, each body verbatim with
// a newline. last is the sequence of the last one.
func Expected(t testing.TB, js jetstream.JetStream, sid string) (trace []byte, last uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var buf bytes.Buffer
	err := bus.Follow(ctx, js, sid, omni.TraceClasses, 0, true, func(m bus.StreamMsg) error {
		msg, err := omni.Decode(m.Data)
		if err != nil || msg.IsPartial() || len(msg.Origin) > 0 {
			return nil
		}
		buf.Write(m.Data)
		buf.WriteByte('\n')
		last = m.Seq
		return nil
	})
	if err != nil {
		t.Fatalf("read stream of %s: %v", sid, err)
	}
	return buf.Bytes(), last
}

// Trace concatenates a Session's Trace files in index order.
func Trace(t testing.TB, home, sid string) []byte {
	t.Helper()
	files, err := trace.Files(home, sid)
	if err != nil {
		t.Fatalf("TraceFiles: %v", err)
	}
	var all []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		all = append(all, b...)
	}
	return all
}

// Pos reads a Session's position; the zero TracePos when it has none.
func Pos(t testing.TB, home, sid string) trace.Pos {
	t.Helper()
	p, _, err := trace.ReadPos(home, sid)
	if err != nil {
		t.Fatalf("ReadTracePos: %v", err)
	}
	return p
}

// Poll retries cond every 10ms until it holds or d passes (the tracer
// writes asynchronously); false on timeout.
func Poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// WaitTrace waits until the Session's Trace equals the oracle's and its
// position covers the last expected record, and fails with a diff of the
// first differing line otherwise.
func WaitTrace(t testing.TB, js jetstream.JetStream, home, sid string) []byte {
	t.Helper()
	want, last := Expected(t, js, sid)
	var got []byte
	ok := Poll(20*time.Second, func() bool {
		got = Trace(t, home, sid)
		return bytes.Equal(got, want) && Pos(t, home, sid).Seq == last
	})
	if !ok {
		t.Fatalf("trace of %s (pos %+v, last seq %d):\n%s", sid, Pos(t, home, sid), last, Diff(got, want))
	}
	return got
}

// Diff describes the first line where got and want differ.
func Diff(got, want []byte) string {
	g, w := bytes.SplitAfter(got, []byte("\n")), bytes.SplitAfter(want, []byte("\n"))
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl []byte
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if !bytes.Equal(gl, wl) {
			return "line " + itoa(i+1) + ":\n got  " + quote(gl) + "\n want " + quote(wl) +
				"\n(" + itoa(len(g)) + " lines got, " + itoa(len(w)) + " want)"
		}
	}
	return "equal"
}

func quote(b []byte) string {
	if b == nil {
		return "<none>"
	}
	q, _ := json.Marshal(string(b))
	return string(q)
}

func itoa(n int) string { return strconv.Itoa(n) }

// TraceRate measures a tracer writing records records of each of sessions
// new Sessions of one day (each starting with its session_meta, with a
// partial beside every record), published while the tracer runs; with
// interleave the Sessions take turns record by record, otherwise they come
// one after another as Sessions created through a day do. It returns
// records per second, from the first publish until the tracer's ack floor
// reaches the last record, and the process's CPU per record.
func TraceRate(t testing.TB, sessions, records int, interleave bool) (rate, cpuPerRecord float64) {
	t.Helper()
	env := bustest.Start(t, bus.Config{})
	text := strings.Repeat("lorem ipsum ", 5)
	sid := func(i int) string { return fmt.Sprintf("session-2026-11-29-20-10-22-%08x", i) }
	record := func(i, r int) []Item {
		id := sid(i)
		if r == 0 {
			return []Item{Msg(t, id, omni.SessionMeta(omni.Meta{SessionID: id, Provider: "scripted", ModelID: "demo", ModelContextWindow: 128000}))}
		}
		return []Item{Msg(t, id, omni.Partial(omni.TypeText, omni.EventDelta, text, "", "")), Msg(t, id, omni.UserText(text))}
	}
	items := make([]Item, 0, 2*sessions*records)
	if interleave {
		for r := range records {
			for i := range sessions {
				items = append(items, record(i, r)...)
			}
		}
	} else {
		for i := range sessions {
			for r := range records {
				items = append(items, record(i, r)...)
			}
		}
	}
	cfg := tracer.DefaultConfig()
	cfg.Home = t.TempDir()
	cfg.Durable = "bench"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	began, cpuBegan := time.Now(), CPUTime()
	go func() { done <- tracer.Run(ctx, env.Conn, cfg, zerolog.Nop()) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}()
	PublishAsync(t, env.JS, items...)
	st, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last := info.State.LastSeq
	bustest.Eventually(t, 10*time.Minute, "all records traced", func() bool {
		c, err := env.JS.Consumer(ctx, omni.SessionsStream, cfg.Durable)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.AckFloor.Stream >= last
	})
	n := float64(sessions * records)
	return n / time.Since(began).Seconds(), float64((CPUTime() - cpuBegan).Microseconds()) / n
}

// CPUTime is the process's user and system CPU time so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
