package task

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine/internal/fold"
	"floe.dev/services/engine/internal/model"
)

// The recorded Trace: one Task with thinking, text, two parallel tool
// calls whose outputs landed in reverse call order, then a failed attempt
// (a half text, timeout) and its successful retry. Regenerate with
// FLOE_RECORD_TRACE=1 go test -run TestRecordReplayTrace ./internal/task
const replayTrace = "testdata/replay_trace.jsonl"

const replaySID = "replay1"

const replayScript = `{"requests": [
  {"steps": [
    {"thinking": "Let me look.", "chunks": 2},
    {"text": "I will run two.", "chunks": 2},
    {"parallel_tool_calls": [
      {"name": "exec_command", "id": "call_1", "arguments": {"cmd": "echo one"}},
      {"name": "exec_command", "id": "call_2", "arguments": {"cmd": "echo two"}}
    ], "interleave": true}
  ]},
  {"expect_tool_outputs": ["call_1", "call_2"],
   "steps": [{"text": "Half", "end": false}, {"error": {"status": "timeout", "message": "reset"}}]},
  {"steps": [{"text": "Both ran."}]},
  {"expect_last_user": "and again", "steps": [{"text": "Again."}]}
]}`

func TestRecordReplayTrace(t *testing.T) {
	if os.Getenv("FLOE_RECORD_TRACE") == "" {
		t.Skip("records testdata/replay_trace.jsonl; set FLOE_RECORD_TRACE=1")
	}
	h := newHarness(t, replayScript, nil)
	h.session(replaySID, omni.ApproveAllowAll)
	// call_1's output is published only after call_2's is stored.
	release := make(chan struct{})
	var fr *fakeRunner
	fr = h.runner(replaySID, func(job omni.ToolJob) *omni.Message {
		if job.ToolCallID == "call_1" {
			go func() {
				<-release
				fr.publish(h.env.JS, replaySID, echo(job))
			}()
			return nil
		}
		out := echo(job)
		fr.publish(h.env.JS, replaySID, out)
		close(release)
		return nil
	})
	if st := h.wait(h.run(replaySID, "t1", "run two")); st != Completed {
		t.Fatalf("status %q", st)
	}
	var buf bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := bus.FollowUntil(ctx, h.env.JS, replaySID, omni.TraceClasses, 0, true, func(sm bus.StreamMsg) error {
		buf.Write(sm.Data)
		buf.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(replayTrace, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// shape is what a model context entry says, without timestamps.
func shape(m omni.Message) string {
	p := m.Payload
	return fmt.Sprintf("%s role=%s call=%s name=%s content=%q", p.Type, p.Role, p.ToolCallID, p.Name, p.Content())
}

func shapes(msgs []*omni.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = shape(*m)
	}
	return out
}

// replayContext is the model context the recorded Trace folds to: the
// completed requests only (the failed attempt's half text is gone), tool
// outputs in call order although the stream holds them the other way.
var replayContext = []string{
	`text role=user call= name= content="run two"`,
	`thinking role=assistant call= name= content="Let me look."`,
	`text role=assistant call= name= content="I will run two."`,
	`tool_call role=assistant call=call_1 name=exec_command content="{\"cmd\":\"echo one\"}"`,
	`tool_call role=assistant call=call_2 name=exec_command content="{\"cmd\":\"echo two\"}"`,
	`tool_call_output role=user call=call_1 name= content="ran call_1"`,
	`tool_call_output role=user call=call_2 name= content="ran call_2"`,
	`text role=assistant call= name= content="Both ran."`,
}

func readReplayTrace(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(replayTrace)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The recorded Trace through the fold gives the expected model context.
func TestReplayRecordedTraceThroughTheFold(t *testing.T) {
	msgs, skipped, err := trace.Read(bytes.NewReader(readReplayTrace(t)))
	if err != nil || len(skipped) > 0 {
		t.Fatalf("read: %v, skipped %d", err, len(skipped))
	}
	// The recording is what the test says it is: outputs in reverse call
	// order on the stream and a failed attempt before the retry.
	o1 := index(msgs, isType(omni.TypeToolCallOutput, "call_1"))
	o2 := index(msgs, isType(omni.TypeToolCallOutput, "call_2"))
	if o1 < 0 || o2 < 0 || o2 > o1 {
		t.Fatalf("recording: outputs call_1@%d call_2@%d, want call_2 first%s", o1, o2, dump(msgs))
	}
	if got := requestEnds(msgs); len(got) != 3 || got[1].status != omni.StatusTimeout {
		t.Fatalf("recording: request_ends %v", got)
	}
	fc := fold.Load(msgs)
	got := shapes(fc.Messages())
	if len(got) != len(replayContext) {
		t.Fatalf("context has %d entries, want %d:\n%q", len(got), len(replayContext), got)
	}
	for i := range got {
		if got[i] != replayContext[i] {
			t.Fatalf("context[%d] = %s\nwant       %s", i, got[i], replayContext[i])
		}
	}
	if fc.OpenRequest() || len(fc.Unpaired()) > 0 {
		t.Fatalf("fold: open request %v, unpaired %v", fc.OpenRequest(), fc.Unpaired())
	}
	if fc.Meta == nil {
		t.Fatal("fold has no session_meta")
	}
}

// recorder wraps a provider and keeps every request's model context.
type recorder struct {
	model.Provider
	mu   sync.Mutex
	reqs [][]*omni.Message
}

// requests returns the model contexts recorded so far.
func (r *recorder) requests() [][]*omni.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]*omni.Message(nil), r.reqs...)
}

// recorded makes the harness's model a recorder of the scripted one.
func (h *harness) recorded() *recorder {
	rec := &recorder{Provider: h.prov}
	h.deps.Resolve = func(string) (model.Provider, model.Info, error) { return rec, h.prov.Info(), nil }
	return rec
}

func (r *recorder) Stream(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, append([]*omni.Message(nil), req.Messages...))
	r.mu.Unlock()
	return r.Provider.Stream(ctx, req, emit)
}

// A Task resumed from the recorded Trace (an imported Trace in
// $FLOE_HOME, nothing on the stream) feeds the model exactly the folded
// context followed by its own input.
func TestResumeFromRecordedTraceFeedsTheFoldedContext(t *testing.T) {
	home := t.TempDir()
	// Only the last request of the script is played: the Trace covers the rest.
	h := newHarness(t, `{"requests": [{"expect_last_user": "and again", "steps": [{"text": "Again."}]}]}`,
		func(s *Settings) { s.Home = home })
	rec := h.recorded()
	path := trace.File(home, time.Now(), replaySID, 1)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, readReplayTrace(t), 0o644); err != nil {
		t.Fatal(err)
	}
	h.session(replaySID, omni.ApproveAllowAll)
	h.complete(replaySID, "t2", "and again")
	reqs := rec.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	want := append(append([]string(nil), replayContext...), `text role=user call= name= content="and again"`)
	got := shapes(reqs[0])
	if len(got) != len(want) {
		t.Fatalf("model context has %d entries, want %d:\n%q", len(got), len(want), got)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("model context[%d] = %s\nwant             %s", i, got[i], want[i])
		}
	}
	// The resumed Task appended to the Session without a second head.
	msgs := h.messages(replaySID)
	if n := index(msgs, func(m *omni.Message) bool { return m.IsSessionMeta() }); n >= 0 {
		t.Fatalf("resumed Task published a session_meta%s", dump(msgs))
	}
}
