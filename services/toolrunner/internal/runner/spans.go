package runner

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/toolrunner/internal/tools"
)

// startSpan starts a job's execute_tool span (docs/protocol.md §9), the
// child of the trace context the engine put in the job's headers: a tool
// call the runner executes is on its Task's trace. The engine enqueues
// only allowed calls, so the decision is allow.
func (r *runner) startSpan(ctx context.Context, m jetstream.Msg, tj *omni.ToolJob) (context.Context, trace.Span) {
	tel := r.cfg.Telemetry
	if !telemetry.Enabled(tel) {
		return ctx, trace.SpanFromContext(ctx) // a no-op span
	}
	ctx = telemetry.Extract(ctx, m.Headers())
	ctx, span := tel.Tracer().Start(ctx, telemetry.ToolSpanName(tj.Name),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
			telemetry.OperationName.String(telemetry.OpExecuteTool),
			telemetry.ConversationID.String(tj.SessionID),
			telemetry.ToolName.String(tj.Name),
			telemetry.ToolCallID.String(tj.ToolCallID),
			telemetry.ToolType.String("function"),
			telemetry.ApprovalDecision.String(omni.DecisionAllow),
			telemetry.RunnerID.String(r.cfg.RunnerID),
		))
	if sb := r.cfg.Sandbox; sb != nil {
		span.SetAttributes(telemetry.SandboxBackend.String(sb.Backend), telemetry.SandboxNetwork.String(sb.Network))
	}
	if tel.CaptureContent() {
		span.SetAttributes(telemetry.ToolCallArguments.String(tj.Arguments))
	}
	return ctx, span
}

// endSpan ends a job's span with the call's status.
func endSpan(tel *telemetry.Provider, span trace.Span, ctx context.Context, res tools.Result) {
	if !telemetry.Enabled(tel) {
		return
	}
	status := omni.StatusCompleted
	switch {
	case errors.Is(context.Cause(ctx), errCancelled):
		status = omni.StatusAborted
	case res.Failed:
		status = omni.StatusFailed
		span.SetStatus(codes.Error, "tool failed")
	}
	span.SetAttributes(telemetry.ToolStatus.String(status))
	if tel.CaptureContent() {
		span.SetAttributes(telemetry.ToolCallResult.String(res.Output))
	}
	span.End()
}
