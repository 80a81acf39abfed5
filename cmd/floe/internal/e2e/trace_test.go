package e2e

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
)

// The Trace equals the stream minus partials, origin-tagged messages and
// server events, in the same order, byte for byte; loading it back gives
// the same model context as the stream.
func TestTraceEqualsStream(t *testing.T) {
	e := start(t, envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			map[string]any{"thinking": "hmm", "fidelity": map[string]any{"signature": "sig=="}},
			map[string]any{"text": "Let me look <here> & \"there\"."},
			call("call_a", "printf 'line1\\nline2\\n'"),
			call("call_b", "echo B; exit 3"),
		}},
		map[string]any{"steps": []any{map[string]any{"text": "Done."}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "trace me"))
	if status != omni.StatusCompleted {
		t.Fatalf("status %s", status)
	}
	// The stream's Trace classes, in order.
	var want [][]byte
	var records []omni.Message
	var last uint64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := bus.FollowUntil(ctx, e.st.JS, sid, omni.TraceClasses, 0, true, func(sm bus.StreamMsg) error {
		m, err := omni.Decode(sm.Data)
		if err != nil {
			t.Fatalf("seq %d: %v", sm.Seq, err)
		}
		if len(m.Origin) == 0 {
			want = append(want, append([]byte(nil), sm.Data...))
			records = append(records, m)
		}
		last = sm.Seq
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = rs
	var pos trace.Pos
	eventually(t, 20*time.Second, "the tracer to catch up", func() bool {
		p, ok, err := trace.ReadPos(e.home, sid)
		pos = p
		return err == nil && ok && p.Seq >= last
	})
	data, err := os.ReadFile(pos.File)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	if len(lines) != len(want) {
		t.Fatalf("trace has %d records, stream %d", len(lines), len(want))
	}
	for i := range lines {
		if !bytes.Equal(lines[i], want[i]) {
			t.Fatalf("record %d:\ntrace  %s\nstream %s", i, lines[i], want[i])
		}
	}
	traced, skipped, err := trace.Read(bytes.NewReader(data))
	if err != nil || len(skipped) > 0 {
		t.Fatalf("ReadTrace: %v, skipped %v", err, skipped)
	}
	a, b := engine.ModelContext(traced), engine.ModelContext(records)
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("context from trace has %d messages, from stream %d", len(a), len(b))
	}
	for i := range a {
		if !bytes.Equal(omni.MustMarshal(&a[i]), omni.MustMarshal(&b[i])) {
			t.Fatalf("context message %d differs", i)
		}
	}
	// The context holds both outputs in call order, B failed with its exit note.
	var outs []omni.Payload
	for _, m := range a {
		if m.Payload.Type == omni.TypeToolCallOutput {
			outs = append(outs, m.Payload)
		}
	}
	if len(outs) != 2 || outs[0].ToolCallID != "call_a" || outs[1].ToolCallID != "call_b" || outs[1].StopReason != omni.StatusFailed {
		t.Fatalf("outputs in context = %+v", outs)
	}
}
