package sse

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

type ev struct {
	Name, Data string
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
		out = append(out, ev{e.Name, string(e.Data)})
	}
}

func TestReaderFraming(t *testing.T) {
	cases := []struct {
		name, in string
		want     []ev
	}{
		{"data lines", "data: a\n\ndata: b\n\n", []ev{{"", "a"}, {"", "b"}}},
		{"crlf", "event: x\r\ndata: a\r\n\r\n", []ev{{"x", "a"}}},
		{"no space after colon", "data:a\n\n", []ev{{"", "a"}}},
		{"only one space stripped", "data:  a\n\n", []ev{{"", " a"}}},
		{"multi-line data", "data: a\ndata: b\n\n", []ev{{"", "a\nb"}}},
		{"comments skipped", ": OPENROUTER PROCESSING\n\n: ping\ndata: a\n\n", []ev{{"", "a"}}},
		{"id and retry ignored", "id: 7\nretry: 100\ndata: a\n\n", []ev{{"", "a"}}},
		{"event without data dropped", "event: ping\n\ndata: a\n\n", []ev{{"", "a"}}},
		{"name reset between events", "event: x\ndata: a\n\ndata: b\n\n", []ev{{"x", "a"}, {"", "b"}}},
		{"empty data dispatched", "data:\n\n", []ev{{"", ""}}},
		{"unterminated last event", "data: a\n\ndata: b", []ev{{"", "a"}, {"", "b"}}},
		{"field without colon", "data\n\n", []ev{{"", ""}}},
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

func TestReaderLongLines(t *testing.T) {
	long := strings.Repeat("x", 200<<10) // beyond the bufio buffer
	got, err := readAll(strings.NewReader("data: " + long + "\n\ndata: y\n\n"))
	if err != nil || len(got) != 2 || got[0].Data != long || got[1].Data != "y" {
		t.Fatalf("long line: %d events, err %v", len(got), err)
	}
}

func TestReaderRejectsOversizeEvents(t *testing.T) {
	if r := NewReader(strings.NewReader("")); r.max != MaxEventSize {
		t.Fatalf("limit = %d, want MaxEventSize", r.max)
	}
	const limit = 64 << 10 // the real limit, scaled down to keep the test fast
	var me *model.Error
	line := "data: " + strings.Repeat("x", 1<<10) + "\n"
	r := NewReader(strings.NewReader(strings.Repeat(line, 65) + "\n"))
	r.max = limit
	if _, err := r.Next(); !errors.As(err, &me) || me.Status != omni.StatusMalformed {
		t.Fatalf("Next on many data lines = %v, want malformed", err)
	}
	r = NewReader(io.MultiReader(strings.NewReader("data: "), bytes.NewReader(bytes.Repeat([]byte("y"), 4*limit))))
	r.max = limit
	if _, err := r.Next(); !errors.As(err, &me) || me.Status != omni.StatusMalformed {
		t.Fatalf("Next on an endless line = %v, want malformed", err)
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
}
