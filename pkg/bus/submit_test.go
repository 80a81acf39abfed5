package bus_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// TestSubmitTaskStoresTheTaskOnceWithItsHeader: a submitted Task is stored
// on its Session's Task subject, decodes to what was sent, carries the
// caller's header fields, and a second submit of the same Task is a
// duplicate the stream drops.
func TestSubmitTaskStoresTheTaskOnceWithItsHeader(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	ctx := context.Background()
	task := &omni.Task{ID: "task-0123456789abcdef", Kind: omni.TaskRun, SessionID: "session-2026-11-29-20-59-59-0123abcd",
		Input: []omni.InputPart{{Type: "text", Text: "hello"}}}
	h := nats.Header{}
	h.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")

	ack, err := bus.SubmitTask(ctx, env.JS, task, h)
	if err != nil {
		t.Fatalf("SubmitTask: %v", err)
	}
	if ack.Duplicate {
		t.Fatal("first submit reported as a duplicate")
	}
	again, err := bus.SubmitTask(ctx, env.JS, task, nil)
	if err != nil {
		t.Fatalf("SubmitTask again: %v", err)
	}
	if !again.Duplicate || again.Sequence != ack.Sequence {
		t.Fatalf("second submit = seq %d duplicate %v, want seq %d duplicate", again.Sequence, again.Duplicate, ack.Sequence)
	}

	s, err := env.JS.Stream(ctx, omni.TasksStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != omni.TaskSubject(task.SessionID) {
		t.Errorf("subject = %q, want %q", m.Subject, omni.TaskSubject(task.SessionID))
	}
	if got := m.Header.Get("traceparent"); got != h.Get("traceparent") {
		t.Errorf("traceparent = %q, want %q", got, h.Get("traceparent"))
	}
	if got := m.Header.Get(nats.MsgIdHdr); got != task.ID {
		t.Errorf("Nats-Msg-Id = %q, want %q", got, task.ID)
	}
	var got omni.Task
	if err := omni.Unpack(m.Data, &got); err != nil {
		t.Fatalf("unpack stored Task: %v", err)
	}
	if got.ID != task.ID || got.SessionID != task.SessionID || got.Kind != task.Kind || len(got.Input) != 1 || got.Input[0].Text != "hello" {
		t.Errorf("stored Task = %+v, want %+v", got, *task)
	}
	if info, _ := s.Info(ctx); info.State.Msgs != 1 {
		t.Errorf("stream holds %d Tasks, want 1", info.State.Msgs)
	}
}

// TestSubmitTaskRefusesATaskWithoutIDs: without an ID (the Msg-Id) or a
// SessionID (the subject) nothing is published.
func TestSubmitTaskRefusesATaskWithoutIDs(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	for _, task := range []*omni.Task{
		{SessionID: "session-2026-11-29-20-59-59-0123abcd", Kind: omni.TaskRun},
		{ID: "task-0123456789abcdef", Kind: omni.TaskRun},
	} {
		if _, err := bus.SubmitTask(context.Background(), env.JS, task, nil); err == nil {
			t.Errorf("SubmitTask(%+v) = nil error, want one", task)
		}
	}
}
