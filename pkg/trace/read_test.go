package trace

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"testing/iotest"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/omni/omnitest"
)

func readTraceString(t *testing.T, s string) ([]omni.Message, []*LineError) {
	t.Helper()
	msgs, skipped, err := Read(strings.NewReader(s))
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
		t.Errorf("Read(torn tail) returned %d records, want %d", len(msgs), len(lines))
	}
	if len(skipped) != 1 {
		t.Fatalf("Read(torn tail) skipped %v, want one line", skipped)
	}
	s := skipped[0]
	if !s.Torn || s.Line != len(lines)+1 || !errors.Is(s, omni.ErrSyntax) {
		t.Errorf("skipped = {Line %d, Torn %v, Err %v}, want {Line %d, Torn true, omni.ErrSyntax}", s.Line, s.Torn, s.Err, len(lines)+1)
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
		t.Errorf("Read(garbage middle) returned %d records, want 6", len(msgs))
	}
	if len(skipped) != 1 || skipped[0].Line != 4 || skipped[0].Torn || !errors.Is(skipped[0], omni.ErrSyntax) {
		t.Fatalf("skipped = %v, want line 4, not torn, omni.ErrSyntax", skipped)
	}
	for i, m := range msgs {
		want := lines[i]
		if got := omni.MustMarshal(&m); !bytes.Equal(got, want) {
			t.Errorf("record %d = %s, want %s", i+1, got, want)
		}
	}
}

func TestReadTraceSkipsInvalidMessage(t *testing.T) {
	lines := goldenLines(t)
	bad := evt(`{"type":"request_end","status":"weird"}`)
	msgs, skipped := readTraceString(t, joinLines(lines[:2])+bad+"\n"+joinLines(lines[2:3]))
	if len(msgs) != 3 || len(skipped) != 1 || skipped[0].Line != 3 || !errors.Is(skipped[0], omni.ErrInvalid) {
		t.Errorf("Read(invalid middle) = %d records, skipped %v; want 3 records, line 3 omni.ErrInvalid", len(msgs), skipped)
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
		t.Errorf("Read(complete last line, no newline) = %d records, skipped %v; want 3, none", len(msgs), skipped)
	}
}

func TestReadTraceIgnoresBlankLinesAndCRLF(t *testing.T) {
	lines := goldenLines(t)
	in := "\n" + string(lines[0]) + "\r\n  \n\r\n" + string(lines[1]) + "\r\n\n"
	msgs, skipped := readTraceString(t, in)
	if len(msgs) != 2 || len(skipped) != 0 {
		t.Errorf("Read(blank lines, CRLF) = %d records, skipped %v; want 2, none", len(msgs), skipped)
	}
}

func TestReadTraceEmptyInput(t *testing.T) {
	msgs, skipped := readTraceString(t, "")
	if len(msgs) != 0 || len(skipped) != 0 {
		t.Errorf("Read(\"\") = %d records, skipped %v; want nothing", len(msgs), skipped)
	}
}

func TestReadTraceReadsLongLines(t *testing.T) {
	out := omni.ToolCallOutput("c1", strings.Repeat("0123456789abcdef", 1<<16), "") // 1 MiB
	lines := goldenLines(t)
	in := joinLines(lines[:1]) + string(omni.MustMarshal(&out)) + "\n" + joinLines(lines[1:2])
	msgs, skipped := readTraceString(t, in)
	if len(msgs) != 3 || len(skipped) != 0 || len(msgs[1].Payload.Output) != 1<<20 {
		t.Errorf("Read(1 MiB line) = %d records, skipped %v; want 3 records, the long one intact", len(msgs), skipped)
	}
}

func TestReadTraceRejectsLinesOver64MiB(t *testing.T) {
	lines := goldenLines(t)
	block := bytes.Repeat([]byte("a"), 64<<10)
	r := io.MultiReader(strings.NewReader(joinLines(lines[:1])), io.LimitReader(repeatReader(block), 65<<20))
	msgs, _, err := Read(r)
	if err == nil || !strings.Contains(err.Error(), "64 MiB") {
		t.Errorf("Read(65 MiB line) error = %v, want a 64 MiB limit error", err)
	}
	if len(msgs) != 1 {
		t.Errorf("Read(65 MiB line) returned %d records before the error, want 1", len(msgs))
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
	msgs, _, err := Read(r)
	if !errors.Is(err, boom) || len(msgs) != 2 {
		t.Errorf("Read(failing reader) = %d records, err %v; want 2 records, %v", len(msgs), err, boom)
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
		got, skipped, err := Read(r)
		if err != nil || len(got) != len(want) || len(skipped) != len(wantSkipped) {
			t.Errorf("Read(%s reader) = %d records, %d skipped, %v; want %d, %d, nil", name, len(got), len(skipped), err, len(want), len(wantSkipped))
			continue
		}
		for i := range got {
			if a, b := omni.MustMarshal(&got[i]), omni.MustMarshal(&want[i]); !bytes.Equal(a, b) {
				t.Errorf("Read(%s reader) record %d = %s, want %s", name, i, a, b)
			}
		}
	}
}

func TestReadTraceReturnsEveryGoldenRecord(t *testing.T) {
	f, err := os.Open(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	msgs, skipped, err := Read(f)
	if err != nil || len(skipped) != 0 {
		t.Fatalf("Read(%s) = skipped %v, err %v; want none", goldenPath, skipped, err)
	}
	lines := goldenLines(t)
	if len(msgs) != len(lines) {
		t.Fatalf("Read(%s) returned %d records, want %d", goldenPath, len(msgs), len(lines))
	}
	for i := range msgs {
		if got := omni.MustMarshal(&msgs[i]); !bytes.Equal(got, lines[i]) {
			t.Errorf("record %d = %s, want %s", i+1, got, lines[i])
		}
	}
}

const goldenPath = "../omni/testdata/golden.jsonl"

func goldenLines(t testing.TB) [][]byte { return omnitest.Lines(t, goldenPath) }

func evt(payload string) string {
	return `{"timestamp":"2026-11-29T20:10:22.531Z","type":"event_msg","payload":` + payload + `}`
}
