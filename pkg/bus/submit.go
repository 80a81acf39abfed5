package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// SubmitTask is the one way a Task is queued: it publishes t on its
// Session's Task subject (FLOE_TASKS, a work queue) with Nats-Msg-Id t.ID,
// so a submit retried within the stream's duplicate window is stored once,
// and waits for the stream's ack. header's fields (the caller's trace
// context, from telemetry.Inject) ride along; nil adds none.
//
// Claiming the Session (Sessions.Begin) comes first and is the caller's:
// who submits decides which state the Session enters and how a failed
// submit releases it.
func SubmitTask(ctx context.Context, js jetstream.JetStream, t *omni.Task, header nats.Header) (*jetstream.PubAck, error) {
	if t.ID == "" || t.SessionID == "" {
		return nil, errors.New("bus: submit task: the Task needs an ID and a SessionID")
	}
	m, err := PackMsg(omni.TaskSubject(t.SessionID), t)
	if err != nil {
		return nil, fmt.Errorf("bus: submit task %s: %w", t.ID, err)
	}
	for k, v := range header {
		m.Header[k] = v
	}
	m.Header.Set(jetstream.MsgIDHeader, t.ID)
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("bus: submit task %s: %w", t.ID, err)
	}
	return ack, nil
}
