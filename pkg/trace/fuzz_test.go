package trace

import (
	"bytes"
	"os"
	"testing"
	"testing/iotest"

	"floe.dev/pkg/omni"
)

func FuzzRead(f *testing.F) {
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
	// The original's 0.2.6+ shapes: four-value stop reasons, error codes,
	// hook records with an object output.
	f.Add([]byte(v0213Seed), uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		// A nonzero cut inside the data tears it there, as a crash mid-write would.
		if cut > 0 && int(cut) < len(data) {
			data = data[:cut]
		}
		lines := bytes.Count(data, []byte("\n"))
		if len(data) > 0 && data[len(data)-1] != '\n' {
			lines++
		}
		msgs, skipped, err := Read(bytes.NewReader(data))
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
			if m, err := omni.Decode(line); err == nil {
				want = append(want, omni.MustMarshal(&m))
			}
		}
		if len(msgs) != len(want) {
			t.Fatalf("ReadTrace returned %d records, decoding line by line gives %d", len(msgs), len(want))
		}
		for i := range msgs {
			if got := omni.MustMarshal(&msgs[i]); !bytes.Equal(got, want[i]) {
				t.Fatalf("record %d = %q, want %q", i, got, want[i])
			}
		}
		// Load's in-memory splitter, and a buffer so small that most lines
		// are gathered from several reads, give the same records and
		// skipped lines.
		for name, next := range map[string]func() ([]byte, error){
			"data":           dataLines(data),
			"16-byte buffer": readerLines(bytes.NewReader(data), 16),
		} {
			var got [][]byte
			sk, err := eachLine(next, func(_ []byte, m *omni.Message) { got = append(got, omni.MustMarshal(m)) })
			if err != nil || len(got) != len(want) || len(sk) != len(skipped) {
				t.Fatalf("eachLine(%s) = %d records, %d skipped, %v; want %d, %d, nil", name, len(got), len(sk), err, len(want), len(skipped))
			}
			for i := range got {
				if !bytes.Equal(got[i], want[i]) {
					t.Fatalf("eachLine(%s) record %d = %q, want %q", name, i, got[i], want[i])
				}
			}
			for i := range sk {
				if sk[i].Line != skipped[i].Line || sk[i].Torn != skipped[i].Torn {
					t.Fatalf("eachLine(%s) skipped line %d (torn %v), Read skipped %d (torn %v)", name, sk[i].Line, sk[i].Torn, skipped[i].Line, skipped[i].Torn)
				}
			}
		}
		again, skipped2, err := Read(iotest.OneByteReader(bytes.NewReader(data)))
		if err != nil || len(again) != len(msgs) || len(skipped2) != len(skipped) {
			t.Fatalf("Read(one byte at a time) = %d records, %d skipped, %v; want %d, %d, nil", len(again), len(skipped2), err, len(msgs), len(skipped))
		}
	})
}

const v0213Seed = `{"timestamp":"2026-09-03T09:00:00.137Z","type":"session_meta","payload":{"session_id":"s","provider":"openai","model_id":"m","model_context_window":128000,"system_prompt":"p","agent_state":"/a","workspace":"/w"}}
{"timestamp":"2026-09-03T09:00:00.274Z","type":"event_msg","payload":{"type":"mcp_connect_end","status":"fatal","error_code":"connect_failed","error_message":"x","results":[{"server":"d","status":"fatal","error_code":"connect_failed","error_message":"x","duration_ms":3}]}}
{"timestamp":"2026-09-03T09:00:00.411Z","type":"model_msg","payload":{"type":"text","role":"user","text":"hi","stop_reason":"completed"}}
{"timestamp":"2026-09-03T09:00:00.548Z","type":"event_msg","payload":{"type":"request_begin"}}
{"timestamp":"2026-09-03T09:00:00.685Z","type":"model_msg","payload":{"type":"text","role":"assistant","text":"He","stop_reason":"retryable"}}
{"timestamp":"2026-09-03T09:00:00.822Z","type":"event_msg","payload":{"type":"request_end","status":"retryable","error_code":"timeout","error_message":"idle","attempt":1,"retry_in_ms":2000}}
{"timestamp":"2026-09-03T09:00:00.959Z","type":"event_msg","payload":{"type":"hook","hook":"stop","name":"goal","decision":"continue","output":{"round":1,"ok":false}}}
{"timestamp":"2026-09-03T09:00:01.096Z","type":"event_msg","payload":{"type":"abort","error_code":"user_abort","error_message":"aborted by user"}}
`
