package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine/internal/fold"
)

const sid = "session-2026-12-03-10-00-00-0000abcd"

type fixture struct {
	t   *testing.T
	env *bustest.Env
	ctx context.Context
	log *bustest.Buffer
	kv  jetstream.KeyValue
	n   int
}

func newFixture(t *testing.T) *fixture {
	env := bustest.Start(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	kv, err := env.JS.KeyValue(ctx, omni.SnapshotsBucket)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, env: env, ctx: ctx, log: &bustest.Buffer{}, kv: kv}
}

func (f *fixture) store() *Store {
	s := Open(f.ctx, f.env.JS, "", zerolog.New(f.log))
	s.Every, s.Grow = 1, 0
	return s
}

// task publishes one Task's records on the Session's subjects, as an
// engine does (a task_state first, then the Trace classes).
func (f *fixture) task(text string, withTool bool) {
	f.t.Helper()
	f.n++
	id := fmt.Sprintf("t%d", f.n)
	f.server(omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateRunning, TaskID: id})
	var recs []omni.Message
	if f.n == 1 {
		recs = append(recs, omni.SessionMeta(omni.Meta{SessionID: sid}), omni.ToolListReady(nil))
	}
	recs = append(recs, omni.UserText(text), omni.RequestBegin(), omni.Text(omni.RoleAssistant, "answer to "+text))
	if withTool {
		recs = append(recs, omni.ToolCall("exec_command", "{}", "call_"+id))
	}
	recs = append(recs, omni.TokenUsage(omni.Usage{Total: int64(10 * f.n)}, omni.Usage{Total: 10}), omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	if withTool {
		recs = append(recs, omni.ToolCallOutput("call_"+id, "out "+id, ""))
	}
	for i := range recs {
		f.publish(&recs[i])
	}
	f.server(omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, TaskID: id})
}

func (f *fixture) publish(m *omni.Message) {
	f.t.Helper()
	msg, err := bus.SessionMsg(sid, m, "")
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.env.JS.PublishMsg(f.ctx, msg); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) server(ev omni.ServerEvent) {
	f.t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.env.JS.Publish(f.ctx, omni.SessionSubject(sid, omni.ClassServer), b); err != nil {
		f.t.Fatal(err)
	}
}

// whole is what a full fold of the history gives.
func (f *fixture) whole() (string, uint64) {
	f.t.Helper()
	fc := fold.New()
	last, _, err := trace.Replay(f.ctx, f.env.JS, "", sid, fc.Apply, fc.Reset)
	if err != nil {
		f.t.Fatal(err)
	}
	return text(f.t, fc), last
}

// covers reports whether a Load's last sequence means what the full
// fold's does: it may be later (the snapshot covers the stream's end when
// it was taken), with no record of the Session in between.
func (f *fixture) covers(last, full uint64) bool {
	f.t.Helper()
	if last == full {
		return true
	}
	more, err := bus.Holds(f.ctx, f.env.JS, sid, omni.TraceClasses, full+1)
	if err != nil {
		f.t.Fatal(err)
	}
	return last > full && !more
}

func (f *fixture) load(s *Store, created int64) (string, uint64) {
	f.t.Helper()
	fc, last, bad, err := s.Load(f.ctx, sid, created, 0)
	if err != nil {
		f.t.Fatalf("Load: %v", err)
	}
	if bad != 0 {
		f.t.Fatalf("Load: %d bad records", bad)
	}
	return text(f.t, fc), last
}

// text is what the model is sent from fc, and the state the engine reads.
func text(t *testing.T, fc *fold.Context) string {
	t.Helper()
	var b bytes.Buffer
	for _, m := range fc.Messages() {
		j, err := omni.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "usage %+v turns %d unpaired %v open %v records %d\n", fc.Usage, fc.Turns, fc.Unpaired(), fc.OpenRequest(), fc.Records)
	return b.String()
}

func (f *fixture) fullFolds() int { return strings.Count(f.log.String(), "folding the whole history") }

// The first Task folds the history and stores a snapshot; later Tasks, on
// this engine (memory) or another (the bucket), start from it and end with
// exactly the full fold's context and sequence.
func TestLoadFromSnapshotEqualsTheFullFold(t *testing.T) {
	f := newFixture(t)
	created := time.Now().UnixMilli()
	a := f.store()
	for i := range 6 {
		f.task(fmt.Sprintf("prompt %d", i), i%2 == 0)
		want, wantLast := f.whole()
		got, last := f.load(a, created)
		if got != want || !f.covers(last, wantLast) {
			t.Fatalf("Task %d on engine a: Load =\n%s(last %d)\nwant\n%s(last %d)", i, got, last, want, wantLast)
		}
		b := f.store() // another engine: the stored snapshot
		if got, last := f.load(b, created); got != want || !f.covers(last, wantLast) {
			t.Fatalf("Task %d on engine b: Load =\n%s(last %d)\nwant\n%s(last %d)", i, got, last, want, wantLast)
		}
	}
	if n := f.fullFolds(); n != 1 {
		t.Fatalf("%d full folds, want 1 (the first Task's):\n%s", n, f.log)
	}
	if !strings.Contains(f.log.String(), `"reason":"none stored"`) {
		t.Fatalf("the first full fold does not say why:\n%s", f.log)
	}
}

// A Session's stored snapshot is rewritten at most once per as many
// records as its context has entries (Grow): the whole context is encoded
// O(1) times per record however long the Session, and another engine
// still starts from the stored one and ends with the full fold.
func TestStoredSnapshotsThinOutAsTheContextGrows(t *testing.T) {
	f := newFixture(t)
	created := time.Now().UnixMilli()
	a := f.store()
	a.Grow = 1
	stream, err := f.env.JS.Stream(f.ctx, "KV_"+omni.SnapshotsBucket)
	if err != nil {
		t.Fatal(err)
	}
	puts := func() uint64 {
		info, err := stream.Info(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	const tasks = 40
	for i := range tasks {
		f.task(fmt.Sprintf("prompt %d", i), i%3 == 0)
		f.load(a, created)
	}
	// 2 entries and 6–8 records a Task: a put when the records since the
	// last reach the entries, about every third of the Tasks so far.
	if n := puts(); n < 3 || n > 15 {
		t.Fatalf("%d snapshots stored over %d Tasks, want 3–15 (one every Task would be %d)", n, tasks, tasks)
	}
	want, wantLast := f.whole()
	if got, last := f.load(f.store(), created); got != want || !f.covers(last, wantLast) {
		t.Fatalf("another engine: Load =\n%s(last %d)\nwant\n%s(last %d)", got, last, want, wantLast)
	}
}

// Every snapshot that does not apply is replaced by the full fold, with a
// log line saying why, and the context is the full fold's.
func TestBadSnapshotsFallBackToTheFullFold(t *testing.T) {
	created := time.Now().UnixMilli()
	good := func(f *fixture) *Snapshot {
		f.t.Helper()
		e, err := f.kv.Get(f.ctx, sid)
		if err != nil {
			f.t.Fatal(err)
		}
		s, err := Decode(e.Value())
		if err != nil {
			f.t.Fatal(err)
		}
		return s
	}
	put := func(f *fixture, s *Snapshot) {
		f.t.Helper()
		b, err := Encode(s)
		if err != nil {
			f.t.Fatal(err)
		}
		if _, err := f.kv.Put(f.ctx, sid, b); err != nil {
			f.t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, reason string
		spoil        func(f *fixture)
		created      int64
	}{
		{"missing", "none stored", func(f *fixture) { f.kv.Delete(f.ctx, sid) }, created},
		{"corrupt", "corrupt", func(f *fixture) { f.kv.Put(f.ctx, sid, []byte("not msgpack")) }, created},
		{"foreign version", "another format version", func(f *fixture) {
			b, _ := omni.Pack(&Envelope{V: Version + 1, Body: []byte{1, 2}})
			f.kv.Put(f.ctx, sid, b)
		}, created},
		{"bad state", "corrupt", func(f *fixture) {
			s := good(f)
			s.State.Entries = append(s.State.Entries, fold.StateEntry{})
			put(f, s)
		}, created},
		{"another session's", "corrupt", func(f *fixture) {
			s := good(f)
			s.SessionID = "session-other"
			put(f, s)
		}, created},
		{"another session of the id", "another Session of the same id", func(f *fixture) {}, created + 1},
		{"another stream", "another incarnation", func(f *fixture) {
			s := good(f)
			s.Epoch++
			put(f, s)
		}, created},
		{"past the end", "past the stream's end", func(f *fixture) {
			s := good(f)
			s.Seq += 1000
			put(f, s)
		}, created},
		{"marked message not the Session's", "no longer holds the Session's message", func(f *fixture) {
			s := good(f)
			s.Mark = 1
			put(f, s)
		}, created},
		{"stale: its tail is no longer retained", "no longer holds", func(f *fixture) {
			st, err := f.env.JS.Stream(f.ctx, omni.SessionsStream)
			if err != nil {
				f.t.Fatal(err)
			}
			if err := st.Purge(f.ctx, jetstream.WithPurgeSequence(good(f).Seq+2)); err != nil {
				f.t.Fatal(err)
			}
		}, created},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			// seq 1: another Session's message
			if _, err := f.env.JS.Publish(f.ctx, omni.SessionSubject("session-other", omni.ClassModel), []byte("{}")); err != nil {
				t.Fatal(err)
			}
			f.task("one", true)
			f.load(f.store(), created) // stores a snapshot
			f.task("two", false)
			tc.spoil(f)
			want, wantLast := f.whole()
			before := f.fullFolds()
			got, last := f.load(f.store(), tc.created)
			if got != want || !f.covers(last, wantLast) {
				t.Fatalf("Load =\n%s(last %d)\nwant\n%s(last %d)", got, last, want, wantLast)
			}
			if f.fullFolds() != before+1 || !strings.Contains(f.log.String(), tc.reason) {
				t.Fatalf("no full fold logged with %q:\n%s", tc.reason, f.log)
			}
		})
	}
}

// A Session deleted (its messages purged) and imported again under its id
// with the same creation time is not given the old Session's context from
// memory or from the bucket.
func TestDeletedSessionsSnapshotIsNotUsed(t *testing.T) {
	f := newFixture(t)
	created := time.Now().UnixMilli()
	s := f.store()
	f.task("old", true)
	f.load(s, created)
	f.task("old two", false)
	f.load(s, created)
	stream, err := f.env.JS.Stream(f.ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(f.ctx, jetstream.WithPurgeSubject(omni.SessionWildcard(sid))); err != nil {
		t.Fatal(err)
	}
	f.n = 0
	f.task("new", false)
	want, _ := f.whole()
	if got, _ := f.load(s, created); got != want {
		t.Fatalf("after delete, Load =\n%s\nwant\n%s", got, want)
	}
	if strings.Contains(want, "old") {
		t.Fatalf("the full fold holds the deleted Session:\n%s", want)
	}
}

// A stored snapshot is compressed (the bucket's block being written keeps
// every version written to it), and one stored uncompressed by an engine
// of version 1 is still started from, without a full fold.
func TestStoredSnapshotsAreCompressed(t *testing.T) {
	f := newFixture(t)
	created := time.Now().UnixMilli()
	for i := range 20 {
		f.task(fmt.Sprintf("prompt %d: what does this folder hold, and why?", i), i%2 == 0)
	}
	f.load(f.store(), created) // stores a snapshot
	e, err := f.kv.Get(f.ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Decode(e.Value())
	if err != nil {
		t.Fatal(err)
	}
	plain, err := omni.Pack(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Value())*2 > len(plain) {
		t.Errorf("stored snapshot %d bytes for %d of msgpack, want under half", len(e.Value()), len(plain))
	}
	v1, err := omni.Pack(&Envelope{V: 1, Body: plain})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.kv.Put(f.ctx, sid, v1); err != nil {
		t.Fatal(err)
	}
	f.task("one more", false)
	want, wantLast := f.whole()
	before := f.fullFolds()
	got, last := f.load(f.store(), created)
	if got != want || !f.covers(last, wantLast) {
		t.Fatalf("Load from a version 1 snapshot =\n%s(last %d)\nwant\n%s(last %d)", got, last, want, wantLast)
	}
	if f.fullFolds() != before {
		t.Fatalf("a version 1 snapshot was not used:\n%s", f.log)
	}
}
