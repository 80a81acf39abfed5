package trace

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"floe.dev/pkg/omni"
)

// peekSamples are records in the encoder's shape and out of it: every one
// must peek to what its decoding says.
func peekSamples(t testing.TB) [][]byte {
	var out [][]byte
	add := func(m omni.Message) {
		m.Timestamp = "2026-12-03T10:00:00.000Z"
		out = append(out, omni.MustMarshal(&m))
	}
	call := omni.ToolCall("exec_command", `{"cmd":"echo \"tool_call_id\":\"x\"}"}`, "call_1")
	add(call)
	call.Payload.StopReason = omni.StatusCompleted
	add(call)
	call.Payload.StopReason = omni.StatusFailed
	add(call)
	sub := omni.ToolCall("run_subagent", `{"prompt":"p","description":"d"}`, "call_sub")
	add(sub)
	nested := omni.ToolCall("exec_command", `{}`, "call_n")
	nested.Origin = []string{"session-child"}
	add(nested)
	esc := omni.ToolCall("exec_command", `{}`, `call_"q"`)
	add(esc)
	add(omni.ToolCallOutput("call_1", `fake end "tool_call_id":"call_2","stop_reason":"failed"}}`, ""))
	add(omni.ToolCallOutput("call_1", "out", omni.StatusFailed))
	out1 := omni.ToolCallOutput("call_1", "out", "")
	out1.Origin = []string{"session-child"}
	add(out1)
	add(omni.RequestBegin())
	rb := omni.RequestBegin()
	rb.Origin = []string{"c"}
	add(rb)
	add(omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	add(omni.RequestEnd(omni.StatusTimeout, "reset", 1, 10))
	add(omni.Abort(omni.AbortedByUser))
	add(omni.CompactionBegin(omni.CompactManual, omni.ModeSummarize, 0, 0))
	add(omni.CompactionEnd(omni.CompactManual, omni.ModeSummarize, omni.StatusCompleted))
	add(omni.Subagent("session-child"))
	add(omni.UserText("hi \"there\""))
	add(omni.Text(omni.RoleAssistant, "ok"))
	add(omni.Thinking("hmm"))
	add(omni.ApprovalDecision(omni.DecisionAllow, "call_1"))
	add(omni.TokenUsage(omni.Usage{Total: 3}, omni.Usage{Total: 3}))
	add(omni.ToolListReady(nil))
	add(omni.Partial("text", "delta", "t", "", ""))
	add(omni.SessionMeta(omni.Meta{SessionID: "s", Provider: "p", ModelID: "m"}))
	// Hand-written lines out of the encoder's shape.
	out = append(out,
		[]byte(`{"type":"event_msg","timestamp":"t","payload":{"type":"request_begin"}}`),
		[]byte(`{"timestamp":"t","type":"event_msg","payload":{"type":"request_begin"},"origin":["c"]}`),
		[]byte(`{"timestamp":"t","type":"model_msg","payload":{"type":"tool_call","role":"assistant","name":"x","tool_call_id":"a"},"origin":["c"]}`),
		[]byte(`{"timestamp":"t","type":"model_msg","payload":{"type":"tool_call","role":"assistant","name":"x","tool_call_id":"a","stop_reason":"aborted"}}`),
		[]byte(`{"timestamp":"t","type":"model_msg","payload":{"type":"tool_call","role":"assistant","name":"x","tool_call_id":"a","stop_reason":"bogus"}}`),
		[]byte(`{"timestamp":"t","type":"model_msg","payload":{"type":"tool_call","role":"assistant","name":"x","tool_call_id":""}}`),
		[]byte(`{"timestamp":"t","type":"model_msg","payload":{"type":"tool_call_output","role":"user","output":"o","tool_call_id":"a\u0062"}}`),
		[]byte(`{"timestamp":"t","type":"event_msg","payload":{"type":"abo\u0072t"}}`),
		[]byte(`{"timestamp":"t","type":"event_msg","payload":{"type":"goal_finished"}}`),
	)
	for _, path := range []string{goldenPath, filepath.Join("..", "..", "cmd", "floe", "internal", "reexec", "testdata", "corpus", "tools_retry.jsonl")} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for line := range bytes.SplitSeq(data, []byte{'\n'}) {
			if line = bytes.TrimSpace(line); len(line) > 0 {
				out = append(out, line)
			}
		}
	}
	return out
}

// checkPeek fails when peek says something of line its decoding
// contradicts.
func checkPeek(t testing.TB, line []byte) {
	p := peek(line)
	if p.kind == peekDecode {
		return
	}
	var m omni.Message
	if err := decode(line, &m); err != nil {
		// Only the fields peek reads are checked: a record whose body is
		// damaged elsewhere is carried as stored (and skipped by every
		// reader of the fork's Trace as of the parent's).
		return
	}
	top := len(m.Origin) == 0 && !m.IsPartial()
	pl := &m.Payload
	switch p.kind {
	case peekInert:
		switch {
		case m.Type == omni.KindSessionMeta,
			top && m.Type == omni.KindModel && (pl.Type == omni.TypeToolCall || pl.Type == omni.TypeToolCallOutput),
			top && m.Type == omni.KindEvent && (pl.Type == omni.TypeRequestBegin || pl.Type == omni.TypeRequestEnd ||
				pl.Type == omni.TypeAbort || pl.Type == omni.TypeCompactionBegin || pl.Type == omni.TypeCompactionEnd ||
				pl.Type == omni.TypeSubagent):
			t.Fatalf("peek: inert, but the record matters to the open state: %s", line)
		}
	case peekCall:
		if !top || m.Type != omni.KindModel || pl.Type != omni.TypeToolCall || pl.ToolCallID != p.id || pl.Name != p.name || pl.Stop() != p.stop {
			t.Fatalf("peek: call %q %q %q, decoded %+v: %s", p.id, p.name, p.stop, m, line)
		}
	case peekOutput:
		if !top || m.Type != omni.KindModel || pl.Type != omni.TypeToolCallOutput || pl.ToolCallID != p.id {
			t.Fatalf("peek: output %q, decoded %+v: %s", p.id, m, line)
		}
	case peekBegin:
		if !top || m.Type != omni.KindEvent || pl.Type != omni.TypeRequestBegin {
			t.Fatalf("peek: request_begin, decoded %+v: %s", m, line)
		}
	}
}

func TestPeekAgreesWithTheDecoder(t *testing.T) {
	seen := map[peekKind]int{}
	for _, line := range peekSamples(t) {
		checkPeek(t, line)
		seen[peek(line).kind]++
	}
	for _, k := range []peekKind{peekDecode, peekInert, peekCall, peekOutput, peekBegin} {
		if seen[k] == 0 {
			t.Errorf("no sample peeks as %d", k)
		}
	}
	// What the encoder writes of the records the open state reads is read
	// by peek, not decoded.
	for _, m := range []omni.Message{omni.ToolCall("x", "{}", "a"), omni.ToolCallOutput("a", "o", ""), omni.RequestBegin()} {
		m.Timestamp = "t"
		if k := peek(omni.MustMarshal(&m)).kind; k == peekDecode {
			t.Errorf("peek decodes %s", omni.MustMarshal(&m))
		}
	}
}

// TestCloseByPeekIsTheFold cuts the golden Trace and a corpus Session
// after every record: what Close finds open is what folding every record,
// decoded, finds.
func TestCloseByPeekIsTheFold(t *testing.T) {
	for _, path := range []string{goldenPath, filepath.Join("..", "..", "cmd", "floe", "internal", "reexec", "testdata", "corpus", "tools_retry.jsonl")} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		msgs, _, _ := Read(bytes.NewReader(data))
		recs := make([]Record, len(msgs))
		for i := range msgs {
			recs[i] = Record{Data: omni.MustMarshal(&msgs[i])}
		}
		for n := 1; n <= len(recs); n++ {
			got, gerr := Close(recs[:n], 1)
			want, werr := closeDecoded(msgs[:n])
			if (gerr == nil) != (werr == nil) {
				t.Fatalf("%s[:%d]: Close error %v, the fold's %v", path, n, gerr, werr)
			}
			if gerr != nil {
				continue
			}
			if len(got.Records) != want.carried || !sameTypes(got.Close, want.close) || len(got.Children) != len(want.children) {
				t.Fatalf("%s[:%d]: Close carries %d, closes with %v, %d children; the fold %d, %v, %d", path, n,
					len(got.Records), types(got.Close), len(got.Children), want.carried, types(want.close), len(want.children))
			}
		}
	}
}

type folded struct {
	carried  int
	close    []omni.Message
	children []Child
}

// closeDecoded is Close by decoded messages only.
func closeDecoded(msgs []omni.Message) (*folded, error) {
	head := -1
	for i := range msgs {
		if msgs[i].Type == omni.KindSessionMeta && len(msgs[i].Origin) == 0 {
			head = i
		}
	}
	if head < 0 {
		return nil, ErrNoHead
	}
	var st openState
	var recs [][]byte
	for i := range msgs[head+1:] {
		st.apply(i, &msgs[head+1+i])
		recs = append(recs, omni.MustMarshal(&msgs[head+1+i]))
	}
	f := &folded{carried: len(msgs) - head - 1}
	f.close, f.children = st.close(recs)
	return f, nil
}

func sameTypes(a, b []omni.Message) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Payload.Type != b[i].Payload.Type || a[i].Payload.Status != b[i].Payload.Status {
			return false
		}
	}
	return true
}

// FuzzPeek: whatever the line, peek never contradicts its decoding.
func FuzzPeek(f *testing.F) {
	for _, line := range peekSamples(f) {
		f.Add(line)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		checkPeek(t, bytes.TrimSpace(line))
	})
}
