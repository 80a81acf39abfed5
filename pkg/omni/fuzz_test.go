package omni

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"testing/iotest"
)

func FuzzDecode(f *testing.F) {
	for _, line := range goldenLines(f) {
		f.Add(line)
	}
	for _, tc := range builderMessages() {
		f.Add(MustMarshal(&tc.m))
	}
	for _, s := range []string{
		`{"v":2,"timestamp":"t","type":"event_msg","payload":{"type":"request_begin"},"origin":null}`,
		env(`{"type":"text","role":"user","text":"a\u0000\ud800\"","x":[{"y":null}],"fidelity":{ "a" : 1 }}`),
		evt(`{"type":"token_usage","session":{"total":9,"input":1},"request":null,"attempt":1e2}`),
		"{\n\"timestamp\": \"t\",\r\n\"payload\": {\"images\": [\n1]}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Message
		if err := Unmarshal(b, &m); err != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("Unmarshal(%q) succeeded, but encoding/json rejects the input", b)
		}
		valid := m.Validate() == nil
		checkOracle(t, b, &m)
		e1, err := Marshal(&m)
		if err != nil {
			t.Fatalf("Marshal(Unmarshal(%q)) error: %v", b, err)
		}
		if !json.Valid(e1) || bytes.ContainsAny(e1, "\r\n") {
			t.Fatalf("Marshal(Unmarshal(%q)) = %q, want valid single-line JSON", b, e1)
		}
		var m2 Message
		if err := Unmarshal(e1, &m2); err != nil {
			t.Fatalf("Unmarshal(%q) (a re-encoding) error: %v", e1, err)
		}
		e2, err := Marshal(&m2)
		if err != nil || !bytes.Equal(e1, e2) {
			t.Fatalf("re-encoding is not idempotent:\n%q\n%q (%v)", e1, e2, err)
		}
		if valid2 := m2.Validate() == nil; valid2 != valid {
			t.Fatalf("Validate = %v before re-encoding and %v after, for %q", valid, valid2, e1)
		}
		// Every strict prefix of a valid encoding is malformed. Long encodings
		// are sampled so a run stays fast.
		step := 1
		if len(e1) > 512 {
			step = len(e1) / 256
		}
		for i := 0; i < len(e1); i += step {
			var p Message
			if err := Unmarshal(e1[:i], &p); !errors.Is(err, ErrSyntax) {
				t.Fatalf("Unmarshal(%q) (a strict prefix) error = %v, want ErrSyntax", e1[:i], err)
			}
		}
	})
}

func FuzzReadTrace(f *testing.F) {
	// Small traces keep minimization fast; the whole golden file runs as a
	// seed too.
	golden, err := os.ReadFile(goldenPath)
	if err != nil {
		f.Fatal(err)
	}
	lines := goldenLines(f)
	small := []byte(joinLines([][]byte{lines[2], lines[3], lines[7], lines[14]}))
	f.Add(golden, uint16(0))
	f.Add(small, uint16(0))
	f.Add(small, uint16(len(small)-40))
	f.Add(append([]byte("garbage\n\n{}\r\n"), small...), uint16(0))
	f.Add([]byte("\n\n\n"), uint16(2))
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		// A nonzero cut inside the data tears it there, as a crash mid-write would.
		if cut > 0 && int(cut) < len(data) {
			data = data[:cut]
		}
		lines := bytes.Count(data, []byte("\n"))
		if len(data) > 0 && data[len(data)-1] != '\n' {
			lines++
		}
		msgs, skipped, err := ReadTrace(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("ReadTrace error: %v", err)
		}
		if len(msgs)+len(skipped) > lines {
			t.Fatalf("ReadTrace returned %d records and %d skipped lines for %d lines", len(msgs), len(skipped), lines)
		}
		prev := 0
		for _, s := range skipped {
			if s.Line <= prev || s.Line > lines {
				t.Fatalf("skipped line %d after %d, of %d lines", s.Line, prev, lines)
			}
			prev = s.Line
			if s.Torn && (s.Line != lines || data[len(data)-1] == '\n') {
				t.Fatalf("line %d reported torn; only an unterminated last line (%d) can be", s.Line, lines)
			}
		}
		// Oracle: the lines split by hand and decoded one by one.
		var want [][]byte
		for i, line := range bytes.Split(data, []byte("\n")) {
			if i >= lines {
				break
			}
			if line = bytes.TrimSpace(line); len(line) == 0 {
				continue
			}
			if m, err := Decode(line); err == nil {
				want = append(want, MustMarshal(&m))
			}
		}
		if len(msgs) != len(want) {
			t.Fatalf("ReadTrace returned %d records, decoding line by line gives %d", len(msgs), len(want))
		}
		for i := range msgs {
			if got := MustMarshal(&msgs[i]); !bytes.Equal(got, want[i]) {
				t.Fatalf("record %d = %q, want %q", i, got, want[i])
			}
		}
		again, skipped2, err := ReadTrace(iotest.OneByteReader(bytes.NewReader(data)))
		if err != nil || len(again) != len(msgs) || len(skipped2) != len(skipped) {
			t.Fatalf("ReadTrace(one byte at a time) = %d records, %d skipped, %v; want %d, %d, nil", len(again), len(skipped2), err, len(msgs), len(skipped))
		}
	})
}

// FuzzStringLiteral checks the string scanner and decoder against
// encoding/json on the inside of one string literal.
func FuzzStringLiteral(f *testing.F) {
	for _, s := range []string{
		`plain`, `\u00e9`, `\ud83d\ude00`, `\ud800`, `\udc00\ud800`, `\ud800\u0041`, `\ud800\ud800\udc00`,
		`\/\b\f\n\r\t\"\\`, "raw \xff\xed\xa0\x80 bytes", `\u12`, `\x`, "\x01", `a\`, "é😀",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, inner []byte) {
		lit := append(append([]byte{'"'}, inner...), '"')
		end, err := scanString(lit, 0)
		ours := err == nil && end == len(lit)
		var want string
		theirs := json.Unmarshal(lit, &want) == nil
		if ours != theirs {
			t.Fatalf("scanString(%q) accepts = %v, encoding/json accepts = %v", lit, ours, theirs)
		}
		if !ours {
			return
		}
		var got string
		if err := decodeStringInto(lit, &got, "f"); err != nil || got != want {
			t.Fatalf("decodeStringInto(%q) = %q, %v; encoding/json says %q", lit, got, err, want)
		}
		if enc := appendString(nil, got); !json.Valid(enc) {
			t.Fatalf("appendString(%q) = %q, not valid JSON", got, enc)
		}
	})
}
