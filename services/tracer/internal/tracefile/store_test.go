package tracefile_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/trace"
	"floe.dev/services/tracer/internal/tracefile"
)

const sid = "session-2026-11-29-20-10-22-1a2b3c4d"

func open(t *testing.T, home string, maxOpen int) *tracefile.Store {
	t.Helper()
	s, err := tracefile.Open(home, maxOpen, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func rec(seq uint64, meta bool) tracefile.Record {
	return tracefile.Record{Seq: seq, Data: fmt.Appendf(nil, `{"n":%d}`, seq), Meta: meta, Time: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)}
}

func lines(seqs ...uint64) string {
	var b strings.Builder
	for _, s := range seqs {
		fmt.Fprintf(&b, "{\"n\":%d}\n", s)
	}
	return b.String()
}

func appendAll(t *testing.T, s *tracefile.Store, id string, wantWritten bool, recs ...tracefile.Record) {
	t.Helper()
	for _, r := range recs {
		written, err := s.Append(id, r)
		if err != nil {
			t.Fatalf("Append(%s, seq %d): %v", id, r.Seq, err)
		}
		if written != wantWritten {
			t.Fatalf("Append(%s, seq %d) written = %v, want %v", id, r.Seq, written, wantWritten)
		}
	}
}

func flush(t *testing.T, s *tracefile.Store) {
	t.Helper()
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

func readAll(t *testing.T, home, id string) string {
	t.Helper()
	files, err := trace.Files(home, id)
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return string(all)
}

func TestResumeTruncatesUnrecordedAppendsAndSkipsRecordedOnes(t *testing.T) {
	home := t.TempDir()
	s := open(t, home, 0)
	appendAll(t, s, sid, true, rec(1, true), rec(2, false), rec(3, false))
	flush(t, s)
	appendAll(t, s, sid, true, rec(5, false), rec(7, false)) // never recorded
	s.Reset()                                                // as a kill would

	appendAll(t, s, sid, false, rec(1, true), rec(3, false)) // redelivered, recorded
	appendAll(t, s, sid, true, rec(5, false), rec(7, false), rec(8, false))
	flush(t, s)
	if got, want := readAll(t, home, sid), lines(1, 2, 3, 5, 7, 8); got != want {
		t.Errorf("trace = %q, want %q", got, want)
	}
	p, ok, err := trace.ReadPos(home, sid)
	want := trace.Pos{Seq: 8, File: trace.File(home, time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), sid, 1), Size: int64(len(lines(1, 2, 3, 5, 7, 8))), Index: 1}
	if !ok || err != nil || p != want {
		t.Errorf("ReadTracePos = %+v, %v, %v; want %+v", p, ok, err, want)
	}
}

func TestFirstAppendIsPrecededByAPosition(t *testing.T) {
	home := t.TempDir()
	s := open(t, home, 0)
	appendAll(t, s, sid, true, rec(4, true))
	// Killed before Flush: the position recorded at load still bounds it.
	p, ok, err := trace.ReadPos(home, sid)
	if !ok || err != nil || p.Seq != 0 || p.Size != 0 {
		t.Fatalf("position before the first flush = %+v, %v, %v; want seq 0 size 0", p, ok, err)
	}
	s.Reset()
	appendAll(t, s, sid, true, rec(4, true))
	flush(t, s)
	if got := readAll(t, home, sid); got != lines(4) {
		t.Errorf("trace = %q, want one record", got)
	}
}

func TestSessionMetaRotatesOnlyAFileWithRecords(t *testing.T) {
	home := t.TempDir()
	s := open(t, home, 0)
	appendAll(t, s, sid, true, rec(1, true), rec(2, false), rec(3, true), rec(4, false), rec(5, true))
	flush(t, s)
	files, _ := trace.Files(home, sid)
	if len(files) != 3 {
		t.Fatalf("files = %v, want 3", files)
	}
	for i, want := range []string{lines(1, 2), lines(3, 4), lines(5)} {
		if b, _ := os.ReadFile(files[i]); string(b) != want {
			t.Errorf("file %d = %q, want %q", i+1, b, want)
		}
	}
	// A rotation written but never recorded is undone on resume.
	appendAll(t, s, sid, true, rec(6, false), rec(7, true), rec(8, false), rec(9, true))
	s.Reset()
	appendAll(t, s, sid, true, rec(6, false))
	flush(t, s)
	if files, _ := trace.Files(home, sid); len(files) != 3 {
		t.Errorf("files after resume = %v, want the unrecorded _004 and _005 removed", files)
	}
	if got, want := readAll(t, home, sid), lines(1, 2, 3, 4, 5, 6); got != want {
		t.Errorf("trace = %q, want %q", got, want)
	}
}

func TestEvictionRecordsThePositionFirst(t *testing.T) {
	home := t.TempDir()
	s := open(t, home, 2)
	ids := []string{sid, "session-2026-11-29-20-10-22-00000002", "session-2026-11-30-00-00-00-00000003"}
	seq := uint64(0)
	for r := 0; r < 5; r++ {
		for _, id := range ids {
			seq++
			appendAll(t, s, id, true, rec(seq, r == 0))
		}
	}
	s.Reset() // killed before any Flush: only evictions recorded positions
	seq = 0
	for r := 0; r < 5; r++ {
		for _, id := range ids {
			seq++
			if _, err := s.Append(id, rec(seq, r == 0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	flush(t, s)
	for i, id := range ids {
		var want []uint64
		for r := 0; r < 5; r++ {
			want = append(want, uint64(r*len(ids)+i+1))
		}
		if got := readAll(t, home, id); got != lines(want...) {
			t.Errorf("%s = %q, want %q", id, got, lines(want...))
		}
	}
}

// An idle Session's file is closed and its state dropped; what it had
// appended but not yet recorded is recorded first, and it carries on from
// there when it comes back.
func TestCloseIdleForgetsIdleSessionsOnly(t *testing.T) {
	home := t.TempDir()
	s := open(t, home, 0)
	const other = "session-2026-11-29-20-10-22-00000002"
	appendAll(t, s, sid, true, rec(1, true), rec(2, false))
	flush(t, s)
	appendAll(t, s, sid, true, rec(3, false)) // not yet recorded
	mid := time.Now()
	time.Sleep(time.Millisecond)
	appendAll(t, s, other, true, rec(4, true))
	if n, err := s.CloseIdle(mid); n != 1 || err != nil {
		t.Fatalf("CloseIdle = %d, %v; want the one Session idle since before", n, err)
	}
	if p, _, _ := trace.ReadPos(home, sid); p.Seq != 3 {
		t.Errorf("position of the closed Session = %+v, want seq 3 recorded on closing", p)
	}
	s.Reset() // a crash now: the closed Session's records stay
	appendAll(t, s, sid, false, rec(3, false))
	appendAll(t, s, sid, true, rec(5, false))
	flush(t, s)
	if got := readAll(t, home, sid); got != lines(1, 2, 3, 5) {
		t.Errorf("trace = %q, want %q", got, lines(1, 2, 3, 5))
	}
	if n, err := s.CloseIdle(time.Now().Add(time.Second)); n != 1 || err != nil {
		t.Errorf("CloseIdle of everything = %d, %v; want 1 (the crash forgot the other)", n, err)
	}
}

func TestLockExcludesASecondStore(t *testing.T) {
	home := t.TempDir()
	first, err := tracefile.Open(home, 0, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tracefile.Open(home, 0, zerolog.Nop()); !errors.Is(err, tracefile.ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := tracefile.Open(home, 0, zerolog.Nop())
	if err != nil {
		t.Fatalf("Open after Close = %v", err)
	}
	second.Close()
}

func TestFileShorterThanItsPositionContinuesAtItsEnd(t *testing.T) {
	home := t.TempDir()
	s := open(t, home, 0)
	appendAll(t, s, sid, true, rec(1, true), rec(2, false))
	flush(t, s)
	s.Reset()
	// A power loss kept only part of the file.
	p, _, _ := trace.ReadPos(home, sid)
	if err := os.Truncate(p.File, int64(len(lines(1))+3)); err != nil {
		t.Fatal(err)
	}
	appendAll(t, s, sid, true, rec(3, false))
	flush(t, s)
	if got, want := readAll(t, home, sid), lines(1)+`{"n`+"\n"+lines(3); got != want {
		t.Errorf("trace = %q, want %q", got, want)
	}
}

func TestRemovedFileIsCreatedAgain(t *testing.T) {
	home := t.TempDir()
	s := open(t, home, 0)
	appendAll(t, s, sid, true, rec(1, true))
	flush(t, s)
	if err := os.RemoveAll(filepath.Join(home, "traces")); err != nil {
		t.Fatal(err)
	}
	appendAll(t, s, sid, true, rec(2, false))
	flush(t, s)
	if got := readAll(t, home, sid); got != lines(2) {
		t.Errorf("trace = %q, want the record after the removal", got)
	}
}

func TestTracePosIsStoredRelativeToHome(t *testing.T) {
	home := t.TempDir()
	file := trace.File(home, time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), sid, 3)
	if err := trace.WritePos(home, sid, trace.Pos{Seq: 42, File: file, Size: 7, Index: 3}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(trace.PosTablePath(home))
	if err != nil {
		t.Fatal(err)
	}
	slot := `{"sid":"` + sid + `","seq":42,"file":"traces/2026-11-29/` + sid + `_003.jsonl","size":7,"index":3,"crc":"`
	i := bytes.Index(raw, []byte(slot))
	if i < 0 || i%512 != 0 || len(raw)%512 != 0 || raw[i+511] != '\n' {
		t.Errorf("position table = %d bytes, slot at %d; want 512-byte slots, one starting %s", len(raw), i, slot)
	}
	// Read from another mount point of the same home.
	moved := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.Rename(home, moved); err != nil {
		t.Fatal(err)
	}
	p, ok, err := trace.ReadPos(moved, sid)
	want := trace.Pos{Seq: 42, File: strings.Replace(file, home, moved, 1), Size: 7, Index: 3}
	if !ok || err != nil || p != want {
		t.Errorf("ReadTracePos = %+v, %v, %v; want %+v", p, ok, err, want)
	}
}

func TestReadTracePos(t *testing.T) {
	home := t.TempDir()
	write := func(s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(home, "tracer"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(trace.PosPath(home, sid), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := trace.ReadPos(home, sid); ok || err != nil {
		t.Errorf("missing position: ok %v, err %v; want false, nil", ok, err)
	}
	// Position files of the older layout.
	write("") // created, not yet written
	if _, ok, err := trace.ReadPos(home, sid); ok || err != nil {
		t.Errorf("empty position: ok %v, err %v; want false, nil", ok, err)
	}
	// Hand-written, without a checksum: accepted.
	write(`{"seq":5,"file":"traces/x/` + sid + `_002.jsonl","size":9,"index":2}`)
	if p, ok, err := trace.ReadPos(home, sid); !ok || err != nil || p.Seq != 5 || p.Index != 2 {
		t.Errorf("hand-written position = %+v, %v, %v", p, ok, err)
	}
	for _, bad := range []string{"{", `{"seq":1,"file":"traces/x/other_001.jsonl","size":1,"index":1}`,
		`{"seq":1,"file":"traces/x/` + sid + `_001.jsonl","size":-1,"index":1}`,
		`{"seq":1,"file":"traces/x/` + sid + `_001.jsonl","size":1,"index":2}`,
		`{"seq":1,"file":"traces/x/` + sid + `_001.jsonl","size":1,"index":1,"crc":"00000000"}`} {
		write(bad)
		if _, _, err := trace.ReadPos(home, sid); !errors.Is(err, trace.ErrBadPos) {
			t.Errorf("ReadTracePos(%q) = %v, want ErrBadTracePos", bad, err)
		}
	}
	// The table's position wins over an older file's.
	if err := trace.WritePos(home, sid, trace.Pos{Seq: 1000, File: "traces/x/" + sid + "_001.jsonl", Size: 123456, Index: 1}); err != nil {
		t.Fatal(err)
	}
	if p, ok, err := trace.ReadPos(home, sid); !ok || err != nil || p.Seq != 1000 {
		t.Errorf("position in the table and a bad file = %+v, %v, %v; want the table's", p, ok, err)
	}
	// A read that caught a write half-way: the new record's head, the old
	// one's tail.
	if err := trace.WritePos(home, sid, trace.Pos{Seq: 999, File: "traces/x/" + sid + "_001.jsonl", Size: 123321, Index: 1}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(trace.PosTablePath(home))
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(raw, []byte(`{"sid":"`+sid))
	copy(raw[i+20:], `9`) // the sid's last bytes changed
	copy(raw[i+60:], `1`)
	if err := os.WriteFile(trace.PosTablePath(home), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := trace.ReadPos(home, sid); !errors.Is(err, trace.ErrBadPos) {
		t.Errorf("torn position: err %v, want ErrBadTracePos", err)
	}
	for _, id := range []string{"a/b", `a\b`, "", "a.b"} {
		if _, _, err := trace.ReadPos(home, id); err == nil {
			t.Errorf("ReadTracePos(%q) = nil error, want a refusal", id)
		}
		if err := trace.WritePos(home, id, trace.Pos{}); err == nil {
			t.Errorf("WriteTracePos(%q) = nil error, want a refusal", id)
		}
	}
}

func TestTraceFilesAreInIndexOrder(t *testing.T) {
	home := t.TempDir()
	touch := func(rel string) string {
		t.Helper()
		p := filepath.Join(home, "traces", rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	want := []string{touch("2026-11-29/" + sid + "_001.jsonl"), touch("2026-11-29/" + sid + "_002.jsonl"), touch("2026-11-29/" + sid + "_003.jsonl")}
	// The tracer numbers files without gaps (and removes unrecorded ones
	// from the end): a file after a gap is not one of them.
	touch("2026-11-29/" + sid + "_005.jsonl")
	touch("2026-11-29/" + sid + "_004.jsonl.tmp")
	touch("2026-11-29/session-2026-11-29-20-10-22-00000002_001.jsonl")
	touch("2026-11-30/" + sid + "_004.jsonl") // not its creation date
	got, err := trace.Files(home, sid)
	if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("TraceFiles = %v, %v; want %v", got, err, want)
	}

	// An id without a date is looked up in every date directory.
	odd := []string{touch("2025-01-01/odd_001.jsonl"), touch("2025-01-02/odd_002.jsonl")}
	if got, err := trace.Files(home, "odd"); err != nil || strings.Join(got, ",") != strings.Join(odd, ",") {
		t.Errorf("TraceFiles(odd) = %v, %v; want %v", got, err, odd)
	}
	if got, err := trace.Files(t.TempDir(), sid); err != nil || len(got) != 0 {
		t.Errorf("TraceFiles of an empty home = %v, %v; want none", got, err)
	}
}

func BenchmarkStoreAppend(b *testing.B) {
	home := b.TempDir()
	s, err := tracefile.Open(home, 0, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := bytes.Repeat([]byte("x"), 150)
	seq := uint64(0)
	b.SetBytes(int64(len(data) + 1))
	for b.Loop() {
		seq++
		id := fmt.Sprintf("session-2026-11-29-20-10-22-%08x", seq%100)
		if _, err := s.Append(id, tracefile.Record{Seq: seq, Data: data}); err != nil {
			b.Fatal(err)
		}
		if seq%256 == 0 {
			if err := s.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func TestNewEpochClearsRecordedSequences(t *testing.T) {
	home := t.TempDir()
	s := open(t, home, 0)
	if changed, err := s.SetEpoch("one"); changed || err != nil {
		t.Fatalf("first SetEpoch = %v, %v; want false, nil", changed, err)
	}
	appendAll(t, s, sid, true, rec(10, true), rec(11, false))
	flush(t, s)
	if changed, err := s.SetEpoch("one"); changed || err != nil {
		t.Fatalf("same SetEpoch = %v, %v; want false, nil", changed, err)
	}
	if changed, err := s.SetEpoch("two"); !changed || err != nil {
		t.Fatalf("new SetEpoch = %v, %v; want true, nil", changed, err)
	}
	if p, _, _ := trace.ReadPos(home, sid); p.Seq != 0 || p.Size != int64(len(lines(10, 11))) {
		t.Fatalf("position after a new epoch = %+v, want seq 0 and the size kept", p)
	}
	appendAll(t, s, sid, true, rec(1, false))
	flush(t, s)
	if got, want := readAll(t, home, sid), lines(10, 11, 1); got != want {
		t.Errorf("trace = %q, want %q", got, want)
	}
}

func TestDeleteRemovesTraceAndDropsPurgedRecordsInFlight(t *testing.T) {
	home := t.TempDir()
	s := open(t, home, 0)
	appendAll(t, s, sid, true, rec(1, true), rec(2, false), rec(3, true), rec(4, false))
	flush(t, s)
	appendAll(t, s, sid, true, rec(5, false)) // appended, not yet recorded
	const other = "session-2025-03-04-05-06-07-00000000"
	appendAll(t, s, other, true, rec(6, true))
	flush(t, s)
	n, err := s.Delete(sid, 7)
	if err != nil || n != 2 {
		t.Fatalf("Delete = %d, %v; want 2 files, nil", n, err)
	}
	if files, _ := trace.Files(home, sid); len(files) != 0 {
		t.Errorf("files left after Delete: %v", files)
	}
	if _, ok, err := trace.ReadPos(home, sid); ok || err != nil {
		t.Errorf("position left after Delete: %v, %v", ok, err)
	}
	// Records delivered before the purge never create the Trace again.
	appendAll(t, s, sid, false, rec(7, false))
	flush(t, s)
	if files, _ := trace.Files(home, sid); len(files) != 0 {
		t.Errorf("a purged record created the Trace again: %v", files)
	}
	if got := readAll(t, home, other); got != lines(6) {
		t.Errorf("other Session's trace = %q, want it untouched", got)
	}
	// Once later messages are acknowledged, the Session is forgotten and
	// deleting it again finds nothing.
	s.Committed(8)
	if n, err := s.Delete(sid, 0); err != nil || n != 0 {
		t.Errorf("second Delete = %d, %v; want 0, nil", n, err)
	}
}

// A home with a Trace imported into another date directory than its id's
// before imports left marks: opening the Store marks it (once), the
// Session's records are appended to it, and Delete removes it with its mark.
func TestImportedTraceOfAnOldHomeIsIndexedAppendedAndDeleted(t *testing.T) {
	home := t.TempDir()
	const imported = "session-2026-07-19-01-10-22-3f8a1c2d" // imported into the 18th
	path := filepath.Join(home, "traces", "2026-07-18", imported+"_001.jsonl")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(lines(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	s := open(t, home, 0)
	mark := filepath.Join(home, "traces", "2026-07-19", imported+".import")
	if b, err := os.ReadFile(mark); err != nil || string(b) != "2026-07-18\n" {
		t.Fatalf("import mark = %q, %v", b, err)
	}
	appendAll(t, s, imported, true, rec(7, false))
	flush(t, s)
	if got, err := os.ReadFile(path); err != nil || string(got) != lines(1, 7) {
		t.Fatalf("imported trace = %q, %v; want the record appended", got, err)
	}
	// A new Session of the same day gets its own file in its id's directory.
	const fresh = "session-2026-07-19-01-10-22-00000001"
	appendAll(t, s, fresh, true, rec(8, true))
	flush(t, s)
	if got := readAll(t, home, fresh); got != lines(8) {
		t.Fatalf("new session's trace = %q", got)
	}
	if n, err := s.Delete(imported, 8); err != nil || n != 1 {
		t.Fatalf("Delete = %d, %v; want 1 file", n, err)
	}
	for _, p := range []string{path, mark} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Delete: %v", p, err)
		}
	}
}
