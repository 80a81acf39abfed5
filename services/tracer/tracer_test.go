package tracer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/tracer"
	tt "floe.dev/services/tracer/internal/tracertest"
)

const sid = "session-2026-11-29-20-10-22-1a2b3c4d"

// running is one tracer started by start.
type running struct {
	stop func()
}

// start runs the tracer on env until stop (or the test's end), failing the
// test if Run returns an error.
func start(t testing.TB, env *bustest.Env, cfg tracer.Config, log zerolog.Logger) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tracer.Run(ctx, env.Conn, cfg, log) }()
	var once sync.Once
	r := &running{stop: func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run = %v, want nil", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return within 30s of its context ending")
			}
		})
	}}
	t.Cleanup(r.stop)
	return r
}

func config(home string) tracer.Config {
	c := tracer.DefaultConfig()
	c.Home = home
	c.RetryMax = 200 * time.Millisecond
	return c
}

func testLog(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
}

func TestTraceEqualsStreamByteForByte(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	start(t, env, config(home), testLog(t))

	tt.Publish(t, env.JS, tt.Session(t, sid)...)
	got := tt.WaitTrace(t, env.JS, home, sid)

	files, err := trace.Files(home, sid)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(home, "traces", "2026-11-29", sid+"_001.jsonl")
	if len(files) != 1 || files[0] != want {
		t.Fatalf("TraceFiles = %v, want [%s]", files, want)
	}
	msgs, skipped, err := trace.Read(bytes.NewReader(got))
	if err != nil || len(skipped) != 0 {
		t.Fatalf("ReadTrace: skipped %v, err %v", skipped, err)
	}
	var types []string
	for _, m := range msgs {
		if m.IsPartial() || len(m.Origin) > 0 {
			t.Errorf("trace holds %s with origin %v", m.Payload.Type, m.Origin)
		}
		typ := m.Payload.Type
		if m.IsSessionMeta() {
			typ = "session_meta"
		}
		types = append(types, typ)
	}
	turn := " request_begin thinking text tool_call approval_decision tool_call_output token_usage request_end"
	wantTypes := "session_meta tool_list_ready text" + turn + " subagent text" + turn
	if got := strings.Join(types, " "); got != wantTypes {
		t.Errorf("record types:\n got  %s\n want %s", got, wantTypes)
	}
	if !bytes.Contains(got, []byte(`"text":"caf\u00e9 \"ok\"","fidelity":{"b": 1,"a":[ ]},"x_future":true`)) {
		t.Errorf("hand-formatted record was not written verbatim")
	}
	pos := tt.Pos(t, home, sid)
	if pos.File != want || pos.Size != int64(len(got)) || pos.Index != 1 {
		t.Errorf("position = %+v, want file %s size %d index 1", pos, want, len(got))
	}
}

func TestSecondSessionMetaRotatesToNextFile(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	start(t, env, config(home), testLog(t))

	items := []tt.Item{tt.Msg(t, sid, tt.Meta(sid)), tt.Msg(t, sid, tt.Tools()), tt.Msg(t, sid, omni.UserText("hi"))}
	items = append(items, tt.Turn(t, sid, 0)...)
	items = append(items,
		tt.Msg(t, sid, omni.CompactionBegin(omni.CompactManual, omni.ModeSummarize, 1200, 1)),
		tt.On(t, sid, omni.ClassTrace, omni.Text(omni.RoleAssistant, omni.Block(omni.TagSummary, "We read a.txt."))),
		tt.Msg(t, sid, omni.TokenUsage(omni.Usage{Total: 1300}, omni.Usage{Total: 100})),
		tt.Msg(t, sid, omni.CompactionEnd(omni.CompactManual, omni.ModeSummarize, omni.StatusCompleted)),
		tt.Msg(t, sid, tt.Meta(sid)),
		tt.Msg(t, sid, tt.Tools()),
		tt.Msg(t, sid, omni.UserText("and now?")),
	)
	items = append(items, tt.Turn(t, sid, 1)...)
	tt.Publish(t, env.JS, items...)
	tt.WaitTrace(t, env.JS, home, sid)

	files, err := trace.Files(home, sid)
	if err != nil || len(files) != 2 {
		t.Fatalf("TraceFiles = %v, %v; want 2 files", files, err)
	}
	first := readTrace(t, files[0])
	if n := len(first); n != 3+8+4 || first[n-1].Payload.Type != omni.TypeCompactionEnd {
		t.Errorf("_001 holds %d records ending with %s, want 15 ending with compaction_end", n, first[n-1].Payload.Type)
	}
	if !strings.HasSuffix(files[1], sid+"_002.jsonl") {
		t.Errorf("second file = %s, want %s_002.jsonl", files[1], sid)
	}
	second := readTrace(t, files[1])
	if len(second) < 2 || second[0].Type != omni.KindSessionMeta || second[1].Payload.Type != omni.TypeToolListReady {
		t.Fatalf("_002 does not start with session_meta, tool_list_ready: %v", second)
	}
	if pos := tt.Pos(t, home, sid); pos.Index != 2 || pos.File != files[1] {
		t.Errorf("position = %+v, want index 2 in %s", pos, files[1])
	}
}

func readTrace(t testing.TB, path string) []omni.Message {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	msgs, skipped, err := trace.Read(f)
	if err != nil || len(skipped) > 0 {
		t.Fatalf("ReadTrace(%s): skipped %v, err %v", path, skipped, err)
	}
	return msgs
}

func TestRestartMidSessionLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	half := len(items) / 2

	first := start(t, env, config(home), testLog(t))
	seqs := tt.Publish(t, env.JS, items[:half]...)
	bustest.Eventually(t, 10*time.Second, "first half traced", func() bool {
		p := tt.Pos(t, home, sid)
		return p.Seq >= lastTraced(t, env, seqs)
	})
	first.stop()

	tt.Publish(t, env.JS, items[half:]...)
	start(t, env, config(home), testLog(t))
	tt.WaitTrace(t, env.JS, home, sid)
}

// lastTraced is the highest of seqs that the oracle puts in the Trace.
func lastTraced(t testing.TB, env *bustest.Env, seqs []uint64) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(seqs) - 1; i >= 0; i-- {
		m, err := stream.GetMsg(ctx, seqs[i])
		if err != nil {
			t.Fatal(err)
		}
		_, class, _ := omni.ParseSessionSubject(m.Subject)
		dm, err := omni.Decode(m.Data)
		if err == nil && !dm.IsPartial() && len(dm.Origin) == 0 && class != omni.ClassNested && class != omni.ClassServer {
			return seqs[i]
		}
	}
	return 0
}

func TestGarbageIsSkippedAndLogged(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	var logs bustest.Buffer
	start(t, env, config(home), zerolog.New(&logs))

	model := omni.SessionSubject(sid, omni.ClassModel)
	tt.Publish(t, env.JS,
		tt.Msg(t, sid, tt.Meta(sid)),
		tt.Item{Subject: model, Data: []byte("not json at all")},
		tt.Item{Subject: model, Data: []byte(`{"timestamp":"2026-11-29T20:10:22.531Z","type":"model_msg","payload":{"type":"text"}}`)}, // no role
		tt.Item{Subject: omni.SessionSubject(sid, omni.ClassEvent), Data: []byte(`{"type":"event_msg"}`)},                              // no timestamp
		tt.Item{Subject: model, Data: []byte(`{"timestamp":"2026-11-29T20:10:22.531Z","type":"model_msg","payload":{"type":"text","role":"user","text":"x"}} trailing`)},
		tt.Item{Subject: model, Data: nil},
		tt.Item{Subject: "floe.session.a/b.model", Data: tt.Msg(t, sid, omni.UserText("bad id")).Data},
		tt.On(t, sid, omni.ClassModel, omni.Partial(omni.TypeText, omni.EventDelta, "misrouted partial", "", "")),
		tt.Msg(t, sid, omni.UserText("still here")),
		tt.Msg(t, sid, omni.RequestBegin()),
	)
	got := tt.WaitTrace(t, env.JS, home, sid)
	msgs, _, _ := trace.Read(bytes.NewReader(got))
	if len(msgs) != 3 || msgs[1].Payload.Text != "still here" {
		t.Errorf("trace = %s, want session_meta, the text and request_begin", got)
	}
	for _, want := range []string{"skipping undecodable message", "skipping partial", "skipping message whose session id cannot name a file"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, logs.String())
		}
	}
	if !strings.Contains(logs.String(), `"session_id":"`+sid+`"`) || !strings.Contains(logs.String(), `"seq":`) {
		t.Errorf("skip log lines lack session_id and seq fields:\n%s", logs.String())
	}
}

func TestManySessionsInterleavedEachGetTheirOwnFile(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	cfg := config(home)
	cfg.MaxOpenFiles = 16 // fewer than the Sessions: exercises eviction and reload
	start(t, env, cfg, testLog(t))

	const sessions, records = 50, 40
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = fmt.Sprintf("session-2026-11-%02d-10-00-00-%08x", 1+i%28, i)
	}
	var items []tt.Item
	for r := 0; r < records; r++ {
		for i, id := range ids {
			var m omni.Message
			switch {
			case r == 0:
				m = tt.Meta(id)
			case r%10 == 5:
				items = append(items, tt.Msg(t, id, omni.Partial(omni.TypeText, omni.EventDelta, "p", "", "")))
				m = omni.Text(omni.RoleAssistant, fmt.Sprintf("session %d record %d", i, r))
			default:
				m = omni.UserText(fmt.Sprintf("session %d record %d", i, r))
			}
			items = append(items, tt.Msg(t, id, m))
		}
	}
	tt.PublishAsync(t, env.JS, items...)
	for i, id := range ids {
		got := tt.WaitTrace(t, env.JS, home, id)
		if n := bytes.Count(got, []byte("\n")); n != records {
			t.Errorf("session %d: %d records, want %d", i, n, records)
		}
		if bytes.Contains(got, []byte(fmt.Sprintf("session %d record", (i+1)%sessions))) {
			t.Errorf("session %d holds another Session's record", i)
		}
	}
}

func TestSessionIDWithoutDateIsDatedByItsFirstRecord(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	start(t, env, config(home), testLog(t))

	const id = "custom-id_42"
	meta := []byte(`{"timestamp":"2025-01-02T23:59:59.999Z","type":"session_meta","payload":{"session_id":"custom-id_42"}}`)
	tt.Publish(t, env.JS,
		tt.Item{Subject: omni.SessionSubject(id, omni.ClassMeta), Data: meta},
		tt.Msg(t, id, omni.UserText("hello")))
	tt.WaitTrace(t, env.JS, home, id)
	want := filepath.Join(home, "traces", "2025-01-02", id+"_001.jsonl")
	if _, err := os.Stat(want); err != nil {
		t.Errorf("trace not at %s: %v", want, err)
	}
}

func TestDeletedSessionFilesAreRecreated(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	var logs bustest.Buffer
	start(t, env, config(home), zerolog.New(&logs))

	tt.Publish(t, env.JS, tt.Msg(t, sid, tt.Meta(sid)), tt.Msg(t, sid, omni.UserText("one")))
	tt.WaitTrace(t, env.JS, home, sid)

	// Something removes the Trace files behind the tracer's back.
	if err := os.RemoveAll(filepath.Join(home, "traces")); err != nil {
		t.Fatal(err)
	}
	late := tt.Msg(t, sid, omni.UserText("late"))
	seqs := tt.Publish(t, env.JS, late)
	bustest.Eventually(t, 10*time.Second, "late record traced", func() bool {
		return tt.Pos(t, home, sid).Seq == seqs[0]
	})
	if got := tt.Trace(t, home, sid); string(got) != string(late.Data)+"\n" {
		t.Errorf("trace after delete = %q, want only the late record", got)
	}
	// Another Session is unaffected.
	const other = "session-2026-11-29-20-10-22-00000002"
	tt.Publish(t, env.JS, tt.Msg(t, other, tt.Meta(other)))
	tt.WaitTrace(t, env.JS, home, other)
	if !strings.Contains(logs.String(), "trace file was removed or replaced") {
		t.Errorf("no log line about the removed file:\n%s", logs.String())
	}
}

func TestForeignTraceWithTornTailGetsANewLine(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	dir := filepath.Join(home, "traces", "2026-11-29")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Written by the TypeScript harness, cut short by a crash, no position.
	m := tt.Meta(sid)
	old := append(omni.MustMarshal(&m), "\n{\"timestamp\":\"2026-11-29T20:1"...)
	path := filepath.Join(dir, sid+"_001.jsonl")
	if err := os.WriteFile(path, old, 0o644); err != nil {
		t.Fatal(err)
	}
	start(t, env, config(home), testLog(t))
	next := tt.Msg(t, sid, omni.UserText("resumed"))
	seqs := tt.Publish(t, env.JS, next)
	bustest.Eventually(t, 10*time.Second, "record traced", func() bool { return tt.Pos(t, home, sid).Seq == seqs[0] })

	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := string(old) + "\n" + string(next.Data) + "\n"; string(got) != want {
		t.Fatalf("trace = %q, want %q", got, want)
	}
	msgs, skipped, _ := trace.Read(bytes.NewReader(got))
	if len(msgs) != 2 || len(skipped) != 1 || skipped[0].Line != 2 {
		t.Errorf("ReadTrace: %d records, skipped %v; want 2 and the torn line 2", len(msgs), skipped)
	}
}

func TestRecordWithLineBreaksStaysOneLine(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	start(t, env, config(home), testLog(t))

	pretty := "{\n  \"timestamp\": \"2026-11-29T20:10:22.531Z\",\r\n  \"type\": \"event_msg\",\n  \"payload\": {\"type\": \"request_begin\"}\n}"
	seqs := tt.Publish(t, env.JS, tt.Item{Subject: omni.SessionSubject(sid, omni.ClassEvent), Data: []byte(pretty)})
	bustest.Eventually(t, 10*time.Second, "record traced", func() bool { return tt.Pos(t, home, sid).Seq == seqs[0] })
	got := tt.Trace(t, home, sid)
	want := strings.NewReplacer("\r", " ", "\n", " ").Replace(pretty) + "\n"
	if string(got) != want {
		t.Errorf("trace = %q, want %q", got, want)
	}
}

func TestSecondTracerOnAHomeWaitsForTheLock(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	first := start(t, env, config(home), testLog(t))
	tt.Publish(t, env.JS, tt.Msg(t, sid, tt.Meta(sid)))
	tt.WaitTrace(t, env.JS, home, sid) // the first one holds the lock
	var logs bustest.Buffer
	start(t, env, config(home), zerolog.New(&logs))
	bustest.Eventually(t, 10*time.Second, "second tracer waiting", func() bool {
		return strings.Contains(logs.String(), "waiting for its lock")
	})
	tt.Publish(t, env.JS, tt.Msg(t, sid, omni.UserText("before the handover")))
	tt.WaitTrace(t, env.JS, home, sid)

	first.stop()
	tt.Publish(t, env.JS, tt.Msg(t, sid, omni.UserText("after the handover")))
	tt.WaitTrace(t, env.JS, home, sid)
	if !strings.Contains(logs.String(), "took the tracer lock") {
		t.Errorf("second tracer never took over:\n%s", logs.String())
	}
}

func TestTracerWaitsForTheStream(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := env.JS.DeleteStream(ctx, omni.SessionsStream); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	var logs bustest.Buffer
	start(t, env, config(home), zerolog.New(&logs))
	bustest.Eventually(t, 10*time.Second, "a retry", func() bool {
		return strings.Contains(logs.String(), "cannot set up the tracer consumer")
	})
	if _, err := bus.Setup(ctx, env.JS, bus.Config{}); err != nil {
		t.Fatal(err)
	}
	tt.Publish(t, env.JS, tt.Msg(t, sid, tt.Meta(sid)))
	tt.WaitTrace(t, env.JS, home, sid)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		edit    func(*tracer.Config)
		wantErr string
	}{
		{"defaults", func(*tracer.Config) {}, ""},
		{"zero tunables take defaults", func(c *tracer.Config) { *c = tracer.Config{Home: c.Home} }, ""},
		{"no home", func(c *tracer.Config) { c.Home = "" }, "Home is required"},
		{"dotted durable", func(c *tracer.Config) { c.Durable = "floe.tracer" }, "durable name"},
		{"negative batch", func(c *tracer.Config) { c.Batch = -1 }, "Batch"},
		{"short fetch wait", func(c *tracer.Config) { c.FetchWait = time.Millisecond }, "FetchWait"},
		{"short ack wait", func(c *tracer.Config) { c.AckWait = time.Millisecond }, "AckWait"},
		{"inverted backoff", func(c *tracer.Config) { c.RetryMin, c.RetryMax = time.Second, time.Millisecond }, "backoff"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tracer.DefaultConfig()
			c.Home = "relative/home"
			tc.edit(&c)
			err := c.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if d := tracer.DefaultConfig(); c.Durable != d.Durable || c.Batch != d.Batch || c.MaxOpenFiles != d.MaxOpenFiles || !filepath.IsAbs(c.Home) {
					t.Errorf("Validate() left %+v, want defaults and an absolute home", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate() = %v, want an error about %s", err, tc.wantErr)
			}
		})
	}
}

func TestRunRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	err := tracer.Run(context.Background(), nil, tracer.Config{}, zerolog.Nop())
	if err == nil {
		t.Fatal("Run with no Home = nil, want an error")
	}
	if errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want a config error", err)
	}
}

func TestContinuingSessionIsTracedAfterTheStreamIsRecreated(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	var logs bustest.Buffer
	start(t, env, config(home), zerolog.New(&logs))
	tt.Publish(t, env.JS, tt.Session(t, sid)...)
	before := tt.WaitTrace(t, env.JS, home, sid)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := env.JS.DeleteStream(ctx, omni.SessionsStream); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Setup(ctx, env.JS, bus.Config{}); err != nil {
		t.Fatal(err)
	}
	// Sequences restart at 1, far below the Session's recorded position.
	next := tt.Msg(t, sid, omni.UserText("after the stream was re-created"))
	seqs := tt.Publish(t, env.JS, next)
	bustest.Eventually(t, 20*time.Second, "record traced", func() bool { return tt.Pos(t, home, sid).Seq == seqs[0] })
	if got, want := tt.Trace(t, home, sid), string(before)+string(next.Data)+"\n"; string(got) != want {
		t.Errorf("trace:\n%s", tt.Diff(got, []byte(want)))
	}
	if !strings.Contains(logs.String(), "the stream was re-created") {
		t.Errorf("no log line about the new stream:\n%s", logs.String())
	}
}

// Not parallel: parallel tests wait until it is done, so any tracer
// goroutine left is this test's.
func TestRunLeavesNoGoroutines(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	r := start(t, env, config(home), testLog(t))
	tt.Publish(t, env.JS, tt.Session(t, sid)...)
	tt.WaitTrace(t, env.JS, home, sid)
	r.stop()
	var stacks string
	ok := tt.Poll(5*time.Second, func() bool {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		return !strings.Contains(stacks, "tracer/internal/consume") && !strings.Contains(stacks, "tracer/internal/tracefile") && !strings.Contains(stacks, "jetstream.(*pullConsumer).fetch")
	})
	if !ok {
		t.Errorf("goroutines left after Run returned:\n%s", stacks)
	}
}

// A delete request with Purge (what the gateway sends: its NATS user may
// not purge FLOE_SESSIONS) makes the tracer purge the Session's messages
// from the stream, and only that Session's, before it deletes the Trace.
func TestDeleteRequestPurgesTheSessionsMessages(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	start(t, env, config(home), testLog(t))
	const other = "session-2026-11-29-20-10-22-00000042"
	tt.Publish(t, env.JS, tt.Session(t, sid)...)
	tt.Publish(t, env.JS, tt.Session(t, other)...)
	tt.WaitTrace(t, env.JS, home, sid)
	want := tt.WaitTrace(t, env.JS, home, other)

	req, _ := omni.Pack(&omni.TraceDelete{Purge: true})
	m, err := env.Conn.Request(omni.TraceDeleteSubject(sid), req, 10*time.Second)
	if err != nil {
		t.Fatalf("delete request: %v", err)
	}
	var reply omni.TraceDeleteReply
	if err := omni.Unpack(m.Data, &reply); err != nil || reply.Error != "" || reply.Files != 1 {
		t.Fatalf("delete reply = %+v, %v; want 1 file, no error", reply, err)
	}
	st, err := env.JS.Stream(context.Background(), omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetLastMsgForSubject(context.Background(), omni.SessionWildcard(sid)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the deleted Session's messages are still on the stream: %v", err)
	}
	if got, _ := tt.Expected(t, env.JS, other); string(got) != string(want) {
		t.Errorf("the other Session's messages changed")
	}
	if files, _ := trace.Files(home, sid); len(files) != 0 {
		t.Errorf("trace files left: %v", files)
	}
}

// TestDeleteRequestRemovesTheTrace: DELETE /api/sessions/:id asks the tracer
// over the bus (only the tracer deletes Trace files); it removes the
// Session's files and position, and answers.
func TestDeleteRequestRemovesTheTrace(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	start(t, env, config(home), testLog(t))
	tt.Publish(t, env.JS, tt.Session(t, sid)...)
	tt.WaitTrace(t, env.JS, home, sid)

	st, err := env.JS.Stream(context.Background(), omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	req, _ := omni.Pack(&omni.TraceDelete{PurgedThrough: 1 << 40})
	m, err := env.Conn.Request(omni.TraceDeleteSubject(sid), req, 10*time.Second)
	if err != nil {
		t.Fatalf("delete request: %v", err)
	}
	var reply omni.TraceDeleteReply
	if err := omni.Unpack(m.Data, &reply); err != nil || reply.Error != "" || reply.Files != 1 {
		t.Fatalf("delete reply = %+v, %v; want 1 file, no error", reply, err)
	}
	if files, _ := trace.Files(home, sid); len(files) != 0 {
		t.Errorf("trace files left: %v", files)
	}
	if _, ok, err := trace.ReadPos(home, sid); ok || err != nil {
		t.Errorf("position left: %v, %v", ok, err)
	}
	// A malformed request and an id that cannot name a file get an error.
	m, err = env.Conn.Request(omni.TraceDeleteSubject(sid), []byte("\xc1"), 10*time.Second)
	if err != nil || omni.Unpack(m.Data, &reply) != nil || reply.Error == "" {
		t.Errorf("malformed request: reply %+v, %v; want an error reply", reply, err)
	}
}
