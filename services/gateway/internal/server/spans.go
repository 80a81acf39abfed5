package server

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"floe.dev/pkg/telemetry"
)

// startSpan starts a request's server span (docs/protocol.md §9), named
// after its route ("POST /api/sessions/{id}/tasks"), the child of a
// traceparent the client sent. A Task the request submits carries its
// context on to the engine (tasks.go). Health checks and metrics scrapes
// are not traced.
func (s *Server) startSpan(r *http.Request, route string) (context.Context, trace.Span) {
	ctx := r.Context()
	tel := s.opts.Telemetry
	if !telemetry.Enabled(tel) || route == "GET /healthz" || route == "GET /metrics" {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = telemetry.Extract(ctx, r.Header)
	name := route
	if !strings.HasPrefix(route, r.Method) {
		name = r.Method + " " + route
	}
	return tel.Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("http.request.method", r.Method),
		attribute.String("http.route", strings.TrimPrefix(route, r.Method+" ")),
		attribute.String("url.path", r.URL.Path),
	))
}

// endSpan ends a request's span with its status code.
func endSpan(span trace.Span, status int) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}
