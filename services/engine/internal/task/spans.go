package task

import (
	"context"
	"encoding/json"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/engine/internal/model"
)

// The Task's spans (docs/protocol.md §9). The engine starts the Task's
// invoke_agent span around Run; the parts below add theirs inside it: a
// chat span per model request attempt, an execute_tool span per call the
// engine itself settles (denied, forbidden, run_subagent; the toolrunner
// makes the span of a call it runs, from the trace context in the job's
// headers), a compaction span. Every function here is safe from any
// goroutine, and does nothing when telemetry is off.

// chatSpan is one model request attempt on the trace.
type chatSpan struct {
	span    trace.Span
	tel     *telemetry.Provider
	start   time.Time
	first   time.Time // the first chunk; zero until then
	attrs   []attribute.KeyValue
	capture bool
}

// startChat starts the span of attempt n of a model request; retry is the
// previous attempt's status when this one retries it.
func startChat(ctx context.Context, tel *telemetry.Provider, info model.Info, attempt int, retry string, req *model.Request) (context.Context, *chatSpan) {
	attrs := []attribute.KeyValue{
		telemetry.OperationName.String(telemetry.OpChat),
		telemetry.ProviderName.String(info.Provider),
		telemetry.RequestModel.String(info.ModelID),
	}
	c := &chatSpan{tel: tel, start: time.Now(), attrs: attrs, capture: tel.CaptureContent()}
	all := append([]attribute.KeyValue{telemetry.ConversationID.String(req.SessionID), telemetry.Attempt.Int(attempt)}, attrs...)
	if retry != "" {
		all = append(all, telemetry.RetryReason.String(retry))
	}
	ctx, c.span = tel.Tracer().Start(ctx, telemetry.ChatSpanName(info.ModelID),
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(all...))
	if c.capture && c.span.IsRecording() {
		if b, err := json.Marshal(req.Messages); err == nil {
			c.span.SetAttributes(telemetry.InputMessages.String(string(b)))
		}
		if req.SystemPrompt != "" {
			c.span.SetAttributes(telemetry.SystemInstructions.String(req.SystemPrompt))
		}
	}
	return ctx, c
}

// chunk notes a chunk of the model's stream (the first one timestamps the
// time to first chunk). Called on the stream's goroutine only.
func (c *chatSpan) chunk() {
	if c.first.IsZero() {
		c.first = time.Now()
	}
}

// end ends the span with the attempt's status, usage and output.
func (c *chatSpan) end(ctx context.Context, status, errMsg string, usage omni.Usage, output []omni.Message) {
	input, out := usage.Total-usage.Output, usage.Output
	if input < 0 {
		input = 0
	}
	c.span.SetAttributes(
		telemetry.FinishReasons.StringSlice([]string{status}),
		telemetry.RequestStatus.String(status),
		telemetry.InputTokens.Int64(input),
		telemetry.OutputTokens.Int64(out),
		telemetry.CacheReadTokens.Int64(usage.CacheRead),
		telemetry.CacheWriteTokens.Int64(usage.CacheWrite),
	)
	if !c.first.IsZero() {
		c.span.SetAttributes(telemetry.TimeToFirstChunk.Float64(c.first.Sub(c.start).Seconds()))
	}
	if c.capture && len(output) > 0 && c.span.IsRecording() {
		if b, err := json.Marshal(output); err == nil {
			c.span.SetAttributes(telemetry.OutputMessages.String(string(b)))
		}
	}
	errType := ""
	if status != omni.StatusCompleted {
		errType = status
		c.span.SetAttributes(telemetry.ErrorType.String(status))
		c.span.SetStatus(codes.Error, errMsg)
	}
	c.span.End()
	c.tel.RecordChat(ctx, time.Since(c.start), input, out, errType, c.attrs...)
}

// startTool starts the execute_tool span of a call the engine settles.
func startTool(ctx context.Context, tel *telemetry.Provider, sid string, tc omni.Message, decision string) (context.Context, trace.Span) {
	ctx, span := tel.Tracer().Start(ctx, telemetry.ToolSpanName(tc.Payload.Name),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
			telemetry.OperationName.String(telemetry.OpExecuteTool),
			telemetry.ConversationID.String(sid),
			telemetry.ToolName.String(tc.Payload.Name),
			telemetry.ToolCallID.String(tc.Payload.ToolCallID),
			telemetry.ToolType.String("function"),
			telemetry.ApprovalDecision.String(decision),
		))
	if tel.CaptureContent() && span.IsRecording() {
		span.SetAttributes(telemetry.ToolCallArguments.String(tc.Payload.Arguments))
	}
	return ctx, span
}

// endTool ends a tool span with the call's status (and output, when
// content is captured).
func endTool(tel *telemetry.Provider, span trace.Span, status, output string) {
	span.SetAttributes(telemetry.ToolStatus.String(status))
	if tel.CaptureContent() && output != "" && span.IsRecording() {
		span.SetAttributes(telemetry.ToolCallResult.String(output))
	}
	if status == omni.StatusFailed {
		span.SetStatus(codes.Error, "tool failed")
	}
	span.End()
}

// withSpan puts span into both scopes of a call, so whatever the call
// starts under either is its child.
func withSpan(ctx, actx context.Context, span trace.Span) (context.Context, context.Context) {
	return trace.ContextWithSpan(ctx, span), trace.ContextWithSpan(actx, span)
}
