package sse

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

type ev struct {
	Name, ID, Data string
	Unterminated   bool
}

func readAll(r io.Reader) ([]ev, error) {
	sr := NewReader(r)
	var out []ev
	for {
		e, err := sr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		id := string(e.ID)
		if !e.HasID {
			id = "-"
		}
		out = append(out, ev{e.Name, id, string(e.Data), e.Unterminated})
	}
}

func TestReaderFraming(t *testing.T) {
	cases := []struct {
		name, in string
		want     []ev
	}{
		{"data lines", "data: a\n\ndata: b\n\n", []ev{{"", "-", "a", false}, {"", "-", "b", false}}},
		{"crlf", "event: x\r\ndata: a\r\n\r\n", []ev{{"x", "-", "a", false}}},
		{"no space after colon", "data:a\n\n", []ev{{"", "-", "a", false}}},
		{"only one space stripped", "data:  a\n\n", []ev{{"", "-", " a", false}}},
		{"multi-line data", "data: a\ndata: b\n\n", []ev{{"", "-", "a\nb", false}}},
		{"comments skipped", ": OPENROUTER PROCESSING\n\n: ping\ndata: a\n\n", []ev{{"", "-", "a", false}}},
		{"id kept, retry read", "id: 7\nretry: 100\ndata: a\n\n", []ev{{"", "7", "a", false}}},
		{"empty id", "id:\ndata: a\n\n", []ev{{"", "", "a", false}}},
		{"id belongs to its event", "id: 1-5\ndata: a\n\ndata: b\n\n", []ev{{"", "1-5", "a", false}, {"", "-", "b", false}}},
		{"event without data dropped", "event: ping\nid: 3\n\ndata: a\n\n", []ev{{"", "-", "a", false}}},
		{"name reset between events", "event: x\ndata: a\n\ndata: b\n\n", []ev{{"x", "-", "a", false}, {"", "-", "b", false}}},
		{"empty data dispatched", "data:\n\n", []ev{{"", "-", "", false}}},
		{"unterminated last event", "data: a\n\ndata: b", []ev{{"", "-", "a", false}, {"", "-", "b", true}}},
		{"unterminated after its line", "id: 1-7\ndata: {\"torn\n", []ev{{"", "1-7", "{\"torn", true}}},
		{"field without colon", "data\n\n", []ev{{"", "-", "", false}}},
		{"blank lines only", "\n\n\n", nil},
		{"empty", "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(c.in), iotest.OneByteReader(strings.NewReader(c.in)), iotest.HalfReader(strings.NewReader(c.in))} {
				got, err := readAll(r)
				if err != nil || !reflect.DeepEqual(got, c.want) {
					t.Fatalf("events(%q) = %v, %v; want %v", c.in, got, err, c.want)
				}
			}
		})
	}
}

func TestReaderRetry(t *testing.T) {
	r := NewReader(strings.NewReader("retry: 250\n\nretry: x\nretry: -5\ndata: a\n\n"))
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if got := r.Retry(); got != 250*time.Millisecond {
		t.Errorf("Retry() = %v, want 250ms (bad values ignored)", got)
	}
}

func TestReaderLongLines(t *testing.T) {
	long := strings.Repeat("x", 200<<10) // beyond the bufio buffer
	got, err := readAll(strings.NewReader("data: " + long + "\n\ndata: y\n\n"))
	if err != nil || len(got) != 2 || got[0].Data != long || got[1].Data != "y" {
		t.Fatalf("long line: %d events, err %v", len(got), err)
	}
}

func TestReaderRejectsOversizeEvents(t *testing.T) {
	if r := NewReader(strings.NewReader("")); r.max != DefaultMaxEventSize {
		t.Fatalf("limit = %d, want DefaultMaxEventSize", r.max)
	}
	const limit = 64 << 10 // the real limit, scaled down to keep the test fast
	line := "data: " + strings.Repeat("x", 1<<10) + "\n"
	r := NewReader(strings.NewReader(strings.Repeat(line, 65) + "\n"))
	r.SetMaxEventSize(limit)
	if _, err := r.Next(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Next on many data lines = %v, want ErrTooLarge", err)
	}
	r = NewReader(io.MultiReader(strings.NewReader("data: "), bytes.NewReader(bytes.Repeat([]byte("y"), 4*limit))))
	r.SetMaxEventSize(limit)
	if _, err := r.Next(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Next on an endless line = %v, want ErrTooLarge", err)
	}
}

func TestReaderPassesReadErrors(t *testing.T) {
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(strings.NewReader("data: a\n\n"), iotest.ErrReader(boom)))
	if e, err := r.Next(); err != nil || string(e.Data) != "a" {
		t.Fatalf("first Next = %q, %v", e.Data, err)
	}
	if _, err := r.Next(); err != boom {
		t.Fatalf("second Next = %v, want the read error", err)
	}
}

func TestReaderStrayReportsNonSSE(t *testing.T) {
	r := NewReader(strings.NewReader("id: 1\nretry: 5\n: c\n<html>oops</html>\n{\"error\":1}\n"))
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("Next = %v, want io.EOF", err)
	}
	if got := r.Stray(); got != "<html>oops</html>" {
		t.Fatalf("Stray = %q", got)
	}
	r = NewReader(strings.NewReader(strings.Repeat("é", 300) + "\n"))
	r.Next()
	if got := r.Stray(); len(got) > 204 || !strings.HasSuffix(got, "é…") {
		t.Fatalf("Stray of a long line = %q (%d bytes), want about 200 bytes cut at a rune", got, len(got))
	}
}

// Steady state allocates nothing per event: the bench reads through it.
func TestReaderAllocatesNothingPerEvent(t *testing.T) {
	const block = "id: 1-42\nevent: server_event\ndata: {\"type\":\"message\",\"text\":\"hello\"}\n\n"
	r := NewReader(&repeat{b: []byte(block)})
	for range 10 {
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(1000, func() {
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Next allocates %v times per event, want 0", n)
	}
}

type repeat struct {
	b   []byte
	off int
}

func (r *repeat) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.b[r.off:])
		n += c
		r.off = (r.off + c) % len(r.b)
	}
	return n, nil
}

// FuzzReader: any input, however it is split into reads, gives the same
// events as in one read, never panics, and never returns an event over
// the limit.
func FuzzReader(f *testing.F) {
	for _, s := range []string{
		"data: a\n\ndata: b\n\n",
		"event: x\r\nid: 1-2\r\ndata: {\"a\":1}\r\n\r\n",
		": ping\n\nretry: 10\ndata:\ndata: z\n\n",
		"data: torn",
		"<html>\n",
		"id: 1\n\n\n\ndata\n\n",
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, in []byte, split uint8) {
		const limit = 1 << 10
		read := func(r io.Reader) ([]ev, error) {
			sr := NewReaderSize(r, 16)
			sr.SetMaxEventSize(limit)
			var out []ev
			for {
				e, err := sr.Next()
				if err != nil {
					if err == io.EOF {
						err = nil
					}
					return out, err
				}
				if len(e.Data) > limit {
					t.Fatalf("event of %d bytes over the limit %d", len(e.Data), limit)
				}
				out = append(out, ev{e.Name, string(e.ID), string(e.Data), e.Unterminated})
			}
		}
		whole, werr := read(bytes.NewReader(in))
		parts, perr := read(&chunked{b: in, n: int(split%7) + 1})
		if (werr == nil) != (perr == nil) || !reflect.DeepEqual(whole, parts) {
			t.Fatalf("in one read: %v, %v; split every %d bytes: %v, %v", whole, werr, split%7+1, parts, perr)
		}
	})
}

// chunked returns at most n bytes per Read.
type chunked struct {
	b []byte
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.b)
	c.b = c.b[k:]
	return k, nil
}
