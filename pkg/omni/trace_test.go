package omni

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func readTraceString(t *testing.T, s string) ([]Message, []*TraceLineError) {
	t.Helper()
	msgs, skipped, err := ReadTrace(strings.NewReader(s))
	if err != nil {
		t.Fatalf("ReadTrace error: %v", err)
	}
	return msgs, skipped
}

func joinLines(lines [][]byte) string {
	return string(bytes.Join(lines, []byte("\n"))) + "\n"
}

func TestReadTraceToleratesTornLastLine(t *testing.T) {
	lines := goldenLines(t)
	torn := string(lines[5][:len(lines[5])/2])
	msgs, skipped := readTraceString(t, joinLines(lines)+torn)
	if len(msgs) != len(lines) {
		t.Errorf("ReadTrace(torn tail) returned %d records, want %d", len(msgs), len(lines))
	}
	if len(skipped) != 1 {
		t.Fatalf("ReadTrace(torn tail) skipped %v, want one line", skipped)
	}
	s := skipped[0]
	if !s.Torn || s.Line != len(lines)+1 || !errors.Is(s, ErrSyntax) {
		t.Errorf("skipped = {Line %d, Torn %v, Err %v}, want {Line %d, Torn true, ErrSyntax}", s.Line, s.Torn, s.Err, len(lines)+1)
	}
	if !strings.Contains(s.Error(), "torn last line") {
		t.Errorf("Error() = %q, want it to say torn last line", s.Error())
	}
}

func TestReadTraceSkipsGarbageMiddleLine(t *testing.T) {
	lines := goldenLines(t)
	in := joinLines(lines[:3]) + "{\"timestamp\":garbage\n" + joinLines(lines[3:6])
	msgs, skipped := readTraceString(t, in)
	if len(msgs) != 6 {
		t.Errorf("ReadTrace(garbage middle) returned %d records, want 6", len(msgs))
	}
	if len(skipped) != 1 || skipped[0].Line != 4 || skipped[0].Torn || !errors.Is(skipped[0], ErrSyntax) {
		t.Fatalf("skipped = %v, want line 4, not torn, ErrSyntax", skipped)
	}
	for i, m := range msgs {
		want := lines[i]
		if got := MustMarshal(&m); !bytes.Equal(got, want) {
			t.Errorf("record %d = %s, want %s", i+1, got, want)
		}
	}
}

func TestReadTraceSkipsInvalidMessage(t *testing.T) {
	lines := goldenLines(t)
	bad := evt(`{"type":"request_end","status":"weird"}`)
	msgs, skipped := readTraceString(t, joinLines(lines[:2])+bad+"\n"+joinLines(lines[2:3]))
	if len(msgs) != 3 || len(skipped) != 1 || skipped[0].Line != 3 || !errors.Is(skipped[0], ErrInvalid) {
		t.Errorf("ReadTrace(invalid middle) = %d records, skipped %v; want 3 records, line 3 ErrInvalid", len(msgs), skipped)
	}
}

func TestReadTraceTornGarbageLastLineWithNewlineIsNotTorn(t *testing.T) {
	lines := goldenLines(t)
	_, skipped := readTraceString(t, joinLines(lines[:2])+"{\"x\n")
	if len(skipped) != 1 || skipped[0].Torn {
		t.Errorf("skipped = %v, want one line that is not torn (it ends with a newline)", skipped)
	}
}

func TestReadTraceAcceptsLastLineWithoutNewline(t *testing.T) {
	lines := goldenLines(t)
	msgs, skipped := readTraceString(t, joinLines(lines[:2])+string(lines[2]))
	if len(msgs) != 3 || len(skipped) != 0 {
		t.Errorf("ReadTrace(complete last line, no newline) = %d records, skipped %v; want 3, none", len(msgs), skipped)
	}
}

func TestReadTraceIgnoresBlankLinesAndCRLF(t *testing.T) {
	lines := goldenLines(t)
	in := "\n" + string(lines[0]) + "\r\n  \n\r\n" + string(lines[1]) + "\r\n\n"
	msgs, skipped := readTraceString(t, in)
	if len(msgs) != 2 || len(skipped) != 0 {
		t.Errorf("ReadTrace(blank lines, CRLF) = %d records, skipped %v; want 2, none", len(msgs), skipped)
	}
}

func TestReadTraceEmptyInput(t *testing.T) {
	msgs, skipped := readTraceString(t, "")
	if len(msgs) != 0 || len(skipped) != 0 {
		t.Errorf("ReadTrace(\"\") = %d records, skipped %v; want nothing", len(msgs), skipped)
	}
}

func TestReadTraceReadsLongLines(t *testing.T) {
	out := ToolCallOutput("c1", strings.Repeat("0123456789abcdef", 1<<16), "") // 1 MiB
	lines := goldenLines(t)
	in := joinLines(lines[:1]) + string(MustMarshal(&out)) + "\n" + joinLines(lines[1:2])
	msgs, skipped := readTraceString(t, in)
	if len(msgs) != 3 || len(skipped) != 0 || len(msgs[1].Payload.Output) != 1<<20 {
		t.Errorf("ReadTrace(1 MiB line) = %d records, skipped %v; want 3 records, the long one intact", len(msgs), skipped)
	}
}

func TestReadTraceRejectsLinesOver64MiB(t *testing.T) {
	lines := goldenLines(t)
	block := bytes.Repeat([]byte("a"), 64<<10)
	r := io.MultiReader(strings.NewReader(joinLines(lines[:1])), io.LimitReader(repeatReader(block), 65<<20))
	msgs, _, err := ReadTrace(r)
	if err == nil || !strings.Contains(err.Error(), "64 MiB") {
		t.Errorf("ReadTrace(65 MiB line) error = %v, want a 64 MiB limit error", err)
	}
	if len(msgs) != 1 {
		t.Errorf("ReadTrace(65 MiB line) returned %d records before the error, want 1", len(msgs))
	}
}

// repeatReader reads its block over and over, without end.
type repeatReader []byte

func (r repeatReader) Read(p []byte) (int, error) {
	return copy(p, r), nil
}

func TestReadTraceReturnsReadErrors(t *testing.T) {
	lines := goldenLines(t)
	boom := errors.New("disk on fire")
	r := io.MultiReader(strings.NewReader(joinLines(lines[:2])), iotest.ErrReader(boom))
	msgs, _, err := ReadTrace(r)
	if !errors.Is(err, boom) || len(msgs) != 2 {
		t.Errorf("ReadTrace(failing reader) = %d records, err %v; want 2 records, %v", len(msgs), err, boom)
	}
}

func TestReadTraceIsIndependentOfReadSizes(t *testing.T) {
	lines := goldenLines(t)
	in := joinLines(lines[:8]) + "not json\n" + joinLines(lines[8:]) + string(lines[3][:10])
	want, wantSkipped := readTraceString(t, in)
	for name, r := range map[string]io.Reader{
		"one byte": iotest.OneByteReader(strings.NewReader(in)),
		"half":     iotest.HalfReader(strings.NewReader(in)),
		"data+EOF": iotest.DataErrReader(strings.NewReader(in)),
	} {
		got, skipped, err := ReadTrace(r)
		if err != nil || len(got) != len(want) || len(skipped) != len(wantSkipped) {
			t.Errorf("ReadTrace(%s reader) = %d records, %d skipped, %v; want %d, %d, nil", name, len(got), len(skipped), err, len(want), len(wantSkipped))
			continue
		}
		for i := range got {
			if a, b := MustMarshal(&got[i]), MustMarshal(&want[i]); !bytes.Equal(a, b) {
				t.Errorf("ReadTrace(%s reader) record %d = %s, want %s", name, i, a, b)
			}
		}
	}
}

func TestSessionIDAndTracePathsRoundTrip(t *testing.T) {
	created := time.Date(2026, 11, 29, 23, 59, 59, 987e6, time.FixedZone("UTC+3", 3*3600))
	sid := NewSessionID(created, "0123abcd")
	if want := "session-2026-11-29-20-59-59-0123abcd"; sid != want {
		t.Fatalf("NewSessionID(%v) = %q, want %q", created, sid, want)
	}
	if !ValidSessionID(sid) {
		t.Errorf("ValidSessionID(%q) = false, want true", sid)
	}
	got, ok := SessionCreated(sid)
	if want := created.Truncate(time.Second).UTC(); !ok || !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("SessionCreated(%q) = %v, %v; want %v, true", sid, got, ok, want)
	}
	home := t.TempDir()
	for _, index := range []int{1, 2, 12, 999, 1000} {
		p := TraceFile(home, got, sid, index)
		dir, base := filepath.Split(p)
		if filepath.Clean(dir) != TraceDir(home, got) || filepath.Clean(dir) != filepath.Join(home, "traces", "2026-11-29") {
			t.Errorf("TraceFile(%d) dir = %q, want %s/traces/2026-11-29", index, dir, home)
		}
		if index == 1 && base != sid+"_001.jsonl" {
			t.Errorf("TraceFile(1) = %q, want %s_001.jsonl", base, sid)
		}
		if n, ok := TraceIndexOf(p, sid); !ok || n != index {
			t.Errorf("TraceIndexOf(%q) = %d, %v; want %d, true", p, n, ok, index)
		}
	}
}

func TestTraceDirUsesUTCDate(t *testing.T) {
	created := time.Date(2026, 11, 30, 1, 0, 0, 0, time.FixedZone("UTC+2", 2*3600))
	if got, want := TraceDir("/h", created), filepath.Join("/h", "traces", "2026-11-29"); got != want {
		t.Errorf("TraceDir(%v) = %q, want %q", created, got, want)
	}
}

func TestTraceIndexOfRejectsOtherNames(t *testing.T) {
	const sid = "session-2026-11-29-20-59-59-0123abcd"
	for _, name := range []string{
		sid + "_000.jsonl", sid + "_abc.jsonl", sid + "_+1.jsonl", sid + "_-1.jsonl", sid + "_ 1.jsonl",
		sid + "_.jsonl", sid + "_001.json", sid + "_001.jsonl.tmp", sid + "001.jsonl",
		"session-2026-11-29-20-59-59-0123abce_001.jsonl", sid + "_0x1.jsonl", "",
	} {
		if n, ok := TraceIndexOf(name, sid); ok {
			t.Errorf("TraceIndexOf(%q) = %d, true; want false", name, n)
		}
	}
}

func TestSessionCreatedRejectsOtherIDs(t *testing.T) {
	for _, id := range []string{
		"", "session-2026-11-29-20-59-59", "session-2026-11-29-20-59-59-0123ABCD", "session-2026-11-29-20-59-59-0123abc",
		"session-2026-13-29-20-59-59-0123abcd", "session-2026-11-29-25-59-59-0123abcd", "x-session-2026-11-29-20-59-59-0123abcd",
		"session-2026-11-29-20-59-59-0123abcd-", "my-session",
	} {
		if tm, ok := SessionCreated(id); ok {
			t.Errorf("SessionCreated(%q) = %v, true; want false", id, tm)
		}
	}
}
