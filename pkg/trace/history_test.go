package trace

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

const sid = "session-2026-11-29-20-59-59-0123abcd"

var created = time.Date(2026, 11, 29, 20, 59, 59, 0, time.UTC)

type fixture struct {
	t    *testing.T
	env  *bustest.Env
	home string
	seqs []uint64
	data [][]byte
}

func newFixture(t *testing.T) *fixture {
	return &fixture{t: t, env: bustest.Start(t, bus.Config{}), home: t.TempDir()}
}

// publish puts a message on the Session's stream and returns its sequence.
func (f *fixture) publish(m omni.Message) uint64 {
	f.t.Helper()
	b := omni.MustMarshal(&m)
	ack, err := f.env.JS.Publish(context.Background(), omni.SessionSubject(sid, omni.ClassOf(&m)), b)
	if err != nil {
		f.t.Fatal(err)
	}
	f.seqs = append(f.seqs, ack.Sequence)
	f.data = append(f.data, b)
	return ack.Sequence
}

// writeFile writes Trace file index with the records i..j of data plus
// extra bytes.
func (f *fixture) writeFile(index, i, j int, extra string) string {
	f.t.Helper()
	path := File(f.home, created, sid, index)
	var b []byte
	for _, d := range f.data[i:j] {
		b = append(append(b, d...), '\n')
	}
	b = append(b, extra...)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		f.t.Fatal(err)
	}
	return path
}

func (f *fixture) load(opt Options) *History {
	f.t.Helper()
	h, err := Load(context.Background(), f.env.JS, f.home, sid, opt)
	if err != nil {
		f.t.Fatalf("Load: %v", err)
	}
	return h
}

func (f *fixture) want(h *History, idx ...int) {
	f.t.Helper()
	if len(h.Records) != len(idx) {
		f.t.Fatalf("Load returned %d records, want %d", len(h.Records), len(idx))
	}
	for k, i := range idx {
		if string(h.Records[k].Data) != string(f.data[i]) {
			f.t.Errorf("record %d = %s, want %s", k, h.Records[k].Data, f.data[i])
		}
	}
}

// checkReplay checks that Replay hands over what Load reads for resuming
// (LastFiles 2: the same records in order, last sequence and bad count),
// that shallow copies of what it hands over stay intact, and that it reset
// as often as want.
func (f *fixture) checkReplay(wantResets int) {
	f.t.Helper()
	ctx := context.Background()
	var (
		kept   []omni.Message
		now    [][]byte // encoded during the call
		resets int
	)
	last, bad, err := Replay(ctx, f.env.JS, f.home, sid, func(m *omni.Message) {
		kept = append(kept, *m)
		now = append(now, omni.MustMarshal(m))
	}, func() { kept, now = nil, nil; resets++ })
	h, wantErr := Load(ctx, f.env.JS, f.home, sid, Options{LastFiles: 2})
	if err != nil || wantErr != nil || last != h.LastSeq || bad != h.Skipped+h.Bad || len(kept) != len(h.Records) || resets != wantResets {
		f.t.Fatalf("Replay = %d records, last %d, bad %d, %d resets, %v; Load = %d, %d, %d, %v; want %d resets",
			len(kept), last, bad, resets, err, len(h.Records), h.LastSeq, h.Skipped+h.Bad, wantErr, wantResets)
	}
	for i, r := range h.Records {
		if got := omni.MustMarshal(&kept[i]); string(got) != string(r.Data) || string(now[i]) != string(r.Data) {
			f.t.Errorf("Replay record %d = %s (%s when handed over), want %s", i, got, now[i], r.Data)
		}
	}
}

func meta() omni.Message {
	return omni.SessionMeta(omni.Meta{SessionID: sid, Provider: "scripted", ModelID: "m"})
}

func TestLoadJoinsTraceUpToPositionWithStream(t *testing.T) {
	f := newFixture(t)
	f.publish(meta())
	f.publish(omni.UserText("one"))
	f.publish(omni.Partial("text", "delta", "t", "", "")) // never a record
	f.publish(omni.Text(omni.RoleAssistant, "two"))
	f.publish(omni.UserText("three"))
	// The tracer wrote records 0, 1, 3 (seq of 3) and then bytes it never
	// recorded (a crash), and started a file it never recorded.
	path := f.writeFile(1, 0, 2, "")
	b, _ := os.ReadFile(path)
	b = append(append(b, f.data[3]...), '\n')
	size := int64(len(b))
	b = append(append(b, f.data[4]...), '\n') // unrecorded
	os.WriteFile(path, b, 0o644)
	f.writeFile(2, 4, 5, "")
	if err := WritePos(f.home, sid, Pos{Seq: f.seqs[3], File: path, Size: size, Index: 1}); err != nil {
		t.Fatal(err)
	}
	var seen []uint64
	h := f.load(Options{OnStream: func(m bus.StreamMsg, record bool) error {
		if !record {
			t.Errorf("stream message %d passed as not a record", m.Seq)
		}
		seen = append(seen, m.Seq)
		return nil
	}})
	f.want(h, 0, 1, 3, 4)
	if !h.HavePos || h.FromStream || h.StreamFrom != f.seqs[3]+1 || h.LastSeq != f.seqs[4] || len(seen) != 1 || seen[0] != f.seqs[4] {
		t.Errorf("Load = pos %v, from stream %v, StreamFrom %d, LastSeq %d, seen %v", h.HavePos, h.FromStream, h.StreamFrom, h.LastSeq, seen)
	}
	if h.Records[0].Seq != 0 || h.Records[3].Seq != f.seqs[4] {
		t.Errorf("record seqs %d, %d; want 0 (Trace) and %d", h.Records[0].Seq, h.Records[3].Seq, f.seqs[4])
	}

	// A live view starting at the partial sees it and the records between
	// without duplicating Trace records.
	var classes []string
	h = f.load(Options{Classes: []string{omni.ClassPartial}, From: f.seqs[2], OnStream: func(m bus.StreamMsg, record bool) error {
		classes = append(classes, m.Class)
		return nil
	}})
	f.want(h, 0, 1, 3, 4)
	if len(classes) != 3 || classes[0] != omni.ClassPartial {
		t.Errorf("live classes %v, want partial, model, model", classes)
	}

	f.checkReplay(0)
}

func TestLoadLastFiles(t *testing.T) {
	f := newFixture(t)
	for i := 0; i < 3; i++ {
		f.publish(meta())
		f.publish(omni.UserText("x"))
	}
	f.writeFile(1, 0, 2, "")
	f.writeFile(2, 2, 4, "")
	p := f.writeFile(3, 4, 6, "")
	fi, _ := os.Stat(p)
	if err := WritePos(f.home, sid, Pos{Seq: f.seqs[5], File: p, Size: fi.Size(), Index: 3}); err != nil {
		t.Fatal(err)
	}
	f.want(f.load(Options{}), 0, 1, 2, 3, 4, 5)
	f.want(f.load(Options{LastFiles: 2}), 2, 3, 4, 5)
	f.checkReplay(0)
}

func TestLoadPrefersStreamOverDamagedTrace(t *testing.T) {
	f := newFixture(t)
	f.publish(meta())
	f.publish(omni.UserText("one"))
	p := f.writeFile(1, 0, 1, "garbage\n")
	b, _ := os.ReadFile(p)
	b = append(append(b, f.data[1]...), '\n')
	os.WriteFile(p, b, 0o644)
	if err := WritePos(f.home, sid, Pos{Seq: f.seqs[1], File: p, Size: int64(len(b)), Index: 1}); err != nil {
		t.Fatal(err)
	}
	h := f.load(Options{})
	f.want(h, 0, 1)
	if !h.FromStream || h.Skipped != 1 || h.Records[0].Seq != f.seqs[0] {
		t.Errorf("Load = from stream %v, skipped %d; want the stream, 1", h.FromStream, h.Skipped)
	}
	f.checkReplay(1) // the Trace's records handed over, then the stream's instead
	// When the stream lost the Session's head, the damaged Trace is used.
	f.deleteMsg(f.seqs[0])
	h = f.load(Options{})
	f.want(h, 0, 1)
	if h.FromStream || h.Skipped != 1 {
		t.Errorf("Load without the stream's head = from stream %v, skipped %d; want the Trace, 1", h.FromStream, h.Skipped)
	}
	f.checkReplay(0)
}

func TestLoadWithoutPosition(t *testing.T) {
	f := newFixture(t)
	f.publish(meta())
	f.publish(omni.UserText("one"))
	// No Trace: the stream.
	h := f.load(Options{})
	f.want(h, 0, 1)
	f.checkReplay(0)
	// An imported Trace (no position, the stream does not hold the
	// Session): the files are the whole history.
	f.data = append(f.data, omni.MustMarshal(ptr(omni.UserText("imported"))))
	f.writeFile(1, 0, 3, "")
	f.deleteMsg(f.seqs[0])
	h = f.load(Options{})
	f.want(h, 0, 1, 2)
	if h.HavePos || h.FromStream {
		t.Errorf("Load(imported) = pos %v, from stream %v", h.HavePos, h.FromStream)
	}
	f.checkReplay(0)
	// A damaged position reads like none.
	os.MkdirAll(filepath.Dir(PosPath(f.home, sid)), 0o755)
	os.WriteFile(PosPath(f.home, sid), []byte("not a position\n"), 0o644)
	f.want(f.load(Options{}), 0, 1, 2)
}

func ptr[T any](v T) *T { return &v }

func (f *fixture) deleteMsg(seq uint64) {
	f.t.Helper()
	st, err := f.env.JS.Stream(context.Background(), omni.SessionsStream)
	if err == nil {
		err = st.DeleteMsg(context.Background(), seq)
	}
	if err != nil {
		f.t.Fatal(err)
	}
}
