package engine

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/engine/internal/task"
)

// startTask starts the Task's invoke_agent span (docs/protocol.md §9),
// the child of the trace context its message carries (the gateway's HTTP
// span, or a parent Task's run_subagent call). A Task that carries none
// gets a trace id derived from its id, so the engine that takes it over
// after a crash continues the same trace either way: the redelivered
// message carries the same headers.
func (e *engine) startTask(ctx context.Context, msg jetstream.Msg, t omni.Task) (context.Context, trace.Span) {
	ctx = telemetry.WithTraceSeed(telemetry.Extract(ctx, msg.Headers()), t.ID)
	attrs := []telemetry.KV{
		telemetry.OperationName.String(telemetry.OpInvokeAgent),
		telemetry.ConversationID.String(t.SessionID),
		telemetry.AgentName.String("floe"),
		telemetry.TaskID.String(t.ID),
	}
	if t.ParentSessionID != "" {
		attrs = append(attrs, telemetry.ParentSessionID.String(t.ParentSessionID))
	}
	return e.cfg.Telemetry.Tracer().Start(ctx, telemetry.OpInvokeAgent,
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// endTask ends the invoke_agent span with the Task's outcome.
func endTask(span trace.Span, status string, err error) {
	switch {
	case errors.Is(err, task.ErrLeaseLost):
		span.SetAttributes(telemetry.TaskStatus.String("taken_over"))
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	default:
		span.SetAttributes(telemetry.TaskStatus.String(status))
		if status == task.Failed {
			span.SetStatus(codes.Error, "the Task failed")
		}
	}
	span.End()
}
