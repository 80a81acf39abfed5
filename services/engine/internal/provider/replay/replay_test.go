package replay

import (
	"context"
	"errors"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

func record() []omni.Message {
	tc := omni.ToolCall("exec_command", `{"cmd":"ls"}`, "call_1")
	tc.Payload.StopReason = omni.StatusCompleted
	return []omni.Message{
		omni.SessionMeta(omni.Meta{SessionID: "s", Provider: "openai", ModelID: "m", ModelContextWindow: 1000}),
		omni.UserText("hi"),
		omni.RequestBegin(),
		omni.Text(omni.RoleAssistant, "half"),
		omni.TokenUsage(omni.Usage{Total: 5}, omni.Usage{Total: 5}),
		omni.RequestEnd(omni.StatusTimeout, "reset", 1, 2000),
		omni.RequestBegin(),
		omni.Thinking("think"),
		tc,
		omni.TokenUsage(omni.Usage{Total: 15}, omni.Usage{Total: 10, Output: 3}),
		omni.RequestEnd(omni.StatusCompleted, "", 2, 0),
	}
}

func TestStreamServesTheRecordedAttemptsInOrder(t *testing.T) {
	var waited []int
	p, err := New(record(), func(_ context.Context, _ string, n int) error { waited = append(waited, n); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if info := p.Info(); info != (model.Info{Provider: "openai", ModelID: "m", ContextWindow: 1000}) || p.Attempts() != 2 {
		t.Fatalf("Info = %+v, %d attempts", info, p.Attempts())
	}
	var ds []model.Delta
	emit := func(d model.Delta) error { ds = append(ds, d); return nil }
	// A title request (never recorded) fails and takes no attempt.
	var me *model.Error
	if _, err := p.Stream(context.Background(), &model.Request{SessionID: "x", Purpose: model.PurposeTitle}, emit); !errors.As(err, &me) || me.Status != omni.StatusFailed || len(ds) != 0 {
		t.Fatalf("title request: %v, deltas %+v", err, ds)
	}
	_, err = p.Stream(context.Background(), &model.Request{SessionID: "x"}, emit)
	if !errors.As(err, &me) || me.Status != omni.StatusTimeout || me.Message != "reset" || len(ds) != 2 || ds[0].Text != "half" || !ds[1].End {
		t.Fatalf("attempt 1: %v, deltas %+v", err, ds)
	}
	ds = nil
	res, err := p.Stream(context.Background(), &model.Request{SessionID: "x"}, emit)
	if err != nil || res.Usage != (omni.Usage{Total: 10, Output: 3}) || res.StopReason != omni.StatusCompleted {
		t.Fatalf("attempt 2: %+v, %v", res, err)
	}
	if len(ds) != 4 || ds[0].Type != omni.TypeThinking || ds[2].Type != omni.TypeToolCall || ds[2].Text != `{"cmd":"ls"}` || ds[3].ToolCallID != "call_1" || ds[3].Name != "exec_command" {
		t.Fatalf("attempt 2 deltas: %+v", ds)
	}
	// Paced to the record: each message after the records before it.
	if want := []int{3, 4, 7, 8, 9}; len(waited) != len(want) {
		t.Errorf("waited for %v, want %v", waited, want)
	}
	if _, err := p.Stream(context.Background(), &model.Request{SessionID: "x"}, emit); !errors.As(err, &me) || me.Status != omni.StatusFailed {
		t.Errorf("a request past the record: %v, want failed", err)
	}
	// Another Session has its own count.
	if _, err := p.Stream(context.Background(), &model.Request{SessionID: "y"}, emit); !errors.As(err, &me) || me.Status != omni.StatusTimeout {
		t.Errorf("another Session's first request: %v, want the first attempt", err)
	}
}

func TestNewRefusesARecordWithoutSessionMeta(t *testing.T) {
	if _, err := New(record()[1:], nil); err == nil {
		t.Error("New without session_meta: no error")
	}
}
