package omni

import (
	"bytes"
	"encoding/json"
	"testing"

	"floe.dev/pkg/omni/omnitest"
)

// testdata/golden.jsonl is a Trace in the original harness's format (protocol.md §1):
// JSON.stringify output, payload keys with type first, then in protocol order. One
// record is an origin-tagged child message, which a real Trace would not hold;
// it is there to cover the envelope's origin.
const goldenPath = "testdata/golden.jsonl"

func goldenLines(t testing.TB) [][]byte { return omnitest.Lines(t, goldenPath) }

func TestGoldenLinesRoundTripByteForByte(t *testing.T) {
	for i, line := range goldenLines(t) {
		m, err := Decode(line)
		if err != nil {
			t.Errorf("line %d: Decode error: %v", i+1, err)
			continue
		}
		got, err := Marshal(&m)
		if err != nil {
			t.Errorf("line %d: Marshal error: %v", i+1, err)
			continue
		}
		if !bytes.Equal(got, line) {
			t.Errorf("line %d: Marshal(Decode(x)) =\n%s\nwant\n%s", i+1, got, line)
		}
		checkOracle(t, line, &m)
	}
}

func TestGoldenRecordsDecodeToTheirMeaning(t *testing.T) {
	var msgs []Message
	for _, line := range goldenLines(t) {
		m, err := Decode(line)
		if err != nil {
			t.Fatalf("Decode(%s) error: %v", line, err)
		}
		msgs = append(msgs, m)
	}
	find := func(pred func(*Message) bool) *Message {
		for i := range msgs {
			if pred(&msgs[i]) {
				return &msgs[i]
			}
		}
		t.Fatalf("no golden record matches")
		return nil
	}
	meta := msgs[0].Payload.Meta()
	if !msgs[0].IsSessionMeta() || meta.SessionID != "session-2026-11-29-20-10-22-4f9c2a1b" || meta.ModelContextWindow != 200000 || meta.AgentState != "" {
		t.Errorf("record 1 = %+v, want the session_meta", meta)
	}
	specs, err := msgs[1].Payload.ToolSpecs()
	if err != nil || len(specs) != 3 || specs[0].Name != "exec" || !json.Valid(specs[0].Parameters) {
		t.Errorf("ToolSpecs() = %+v, %v; want exec, read_file, run_subagent", specs, err)
	}
	th := find(func(m *Message) bool { return m.Payload.Type == TypeThinking })
	if string(th.Payload.Fidelity) != `{"signature":"EqQBCkYIBxgCKkDk9v…Zm9vYmFy=="}` {
		t.Errorf("thinking fidelity = %s, want the signature object verbatim", th.Payload.Fidelity)
	}
	failed := find(func(m *Message) bool { return m.Payload.Type == TypeRequestEnd && m.Payload.Status == StatusFailed })
	if p := failed.Payload; p.ErrorMessage == "" || p.Attempt != 1 || p.RetryInMs != 2000 {
		t.Errorf("failed request_end = (%q, %d, %d), want an error message, attempt 1, retry 2000", p.ErrorMessage, p.Attempt, p.RetryInMs)
	}
	out := find(func(m *Message) bool {
		return m.Payload.Type == TypeToolCallOutput && m.Payload.StopReason == StatusFailed
	})
	if out.Payload.ToolCallID != "toolu_01A" {
		t.Errorf("failed tool output belongs to %q, want toolu_01A", out.Payload.ToolCallID)
	}
	tu := find(func(m *Message) bool { return m.Payload.Type == TypeTokenUsage })
	if tu.Payload.Session == nil || *tu.Payload.Session != (Usage{0, 1893, 164, 2057}) {
		t.Errorf("first token_usage session = %+v, want {0 1893 164 2057}", tu.Payload.Session)
	}
	nested := find(func(m *Message) bool { return m.IsNested() })
	if ClassOf(nested) != ClassNested || nested.Origin[0] != "session-2026-11-29-20-11-05-9e0d7c3a" {
		t.Errorf("nested record origin = %q, class %s; want the child session, nested", nested.Origin, ClassOf(nested))
	}
	last := msgs[len(msgs)-1]
	if last.Payload.Type != TypeAbort || last.Payload.Reason != "user" {
		t.Errorf("last record = %s %q, want abort user", last.Payload.Type, last.Payload.Reason)
	}
}
