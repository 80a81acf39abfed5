package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"floe.dev/pkg/telemetry"
	"floe.dev/pkg/telemetry/otlptest"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestOffWithoutEndpointMakesNoConnection(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	// The exporter would read OTEL_EXPORTER_OTLP_ENDPOINT from the process;
	// FromEnv decides from getenv, which has no endpoint.
	t.Setenv(telemetry.EnvEndpoint, srv.URL)
	p, err := telemetry.FromEnv(context.Background(), "floe-test", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if telemetry.Enabled(p) {
		t.Fatal("Enabled without an endpoint in getenv")
	}
	ctx, span := p.Tracer().Start(context.Background(), "x")
	span.End()
	if trace.SpanContextFromContext(ctx).IsValid() {
		t.Error("a no-op tracer made a valid span context")
	}
	h := map[string][]string{}
	telemetry.Inject(ctx, h)
	if len(h) != 0 {
		t.Errorf("Inject of a no-op span wrote %v", h)
	}
	p.RecordChat(ctx, time.Second, 1, 2, "")
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests to the endpoint with telemetry off", n)
	}
}

func TestSDKDisabledWins(t *testing.T) {
	p, err := telemetry.FromEnv(context.Background(), "floe-test", env(map[string]string{
		telemetry.EnvEndpoint: "http://127.0.0.1:1", telemetry.EnvSDKDisabled: "true"}))
	if err != nil || telemetry.Enabled(p) {
		t.Fatalf("FromEnv with OTEL_SDK_DISABLED = %v, %v; want off", p, err)
	}
}

func TestGRPCProtocolIsRefused(t *testing.T) {
	_, err := telemetry.FromEnv(context.Background(), "floe-test", env(map[string]string{
		telemetry.EnvEndpoint: "http://127.0.0.1:1", telemetry.EnvProtocol: "grpc"}))
	if err == nil {
		t.Fatal("FromEnv accepted OTEL_EXPORTER_OTLP_PROTOCOL=grpc")
	}
}

func TestExportsSpansAndMetricsAndPropagates(t *testing.T) {
	rcv := otlptest.New(t)
	vars := map[string]string{telemetry.EnvEndpoint: rcv.URL}
	ctx := context.Background()
	a, err := telemetry.FromEnv(ctx, "floe-a", env(vars))
	if err != nil {
		t.Fatal(err)
	}
	b, err := telemetry.FromEnv(ctx, "floe-b", env(vars))
	if err != nil {
		t.Fatal(err)
	}
	if a.CaptureContent() {
		t.Error("content capture on by default")
	}
	actx, parent := a.Tracer().Start(ctx, "invoke_agent", trace.WithAttributes(telemetry.ConversationID.String("s1")))
	h := map[string][]string{}
	telemetry.Inject(actx, h)
	if len(h["traceparent"]) != 1 {
		t.Fatalf("header after Inject = %v, want a traceparent", h)
	}
	meta := map[string]any{}
	telemetry.InjectMeta(actx, meta)
	if meta["traceparent"] != h["traceparent"][0] {
		t.Errorf("_meta traceparent %v, header %v", meta["traceparent"], h["traceparent"])
	}
	// Another process continues the trace from the header.
	bctx := telemetry.Extract(ctx, h)
	_, child := b.Tracer().Start(bctx, telemetry.ToolSpanName("exec_command"))
	child.End()
	parent.End()
	a.RecordChat(actx, 1500*time.Millisecond, 10, 5, "")
	for _, p := range []*telemetry.Provider{a, b} {
		if err := p.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	spans := rcv.WaitFor(t, 10*time.Second, "two spans", func(s []otlptest.Span) bool { return len(s) == 2 })
	byName := map[string]otlptest.Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	root, tool := byName["invoke_agent"], byName["execute_tool exec_command"]
	if root.Service != "floe-a" || tool.Service != "floe-b" {
		t.Errorf("services %q, %q; want floe-a, floe-b", root.Service, tool.Service)
	}
	if tool.TraceID != root.TraceID || tool.ParentSpanID != root.SpanID {
		t.Errorf("tool span trace %s parent %s; want trace %s parent %s", tool.TraceID, tool.ParentSpanID, root.TraceID, root.SpanID)
	}
	if root.Attr("gen_ai.conversation.id") != "s1" {
		t.Errorf("attrs %v", root.Attrs)
	}
	m := rcv.Metrics()
	if m["gen_ai.client.token.usage"] == 0 || m["gen_ai.client.operation.duration"] == 0 {
		t.Errorf("metrics %v; want the GenAI client metrics", m)
	}
	if bad := rcv.Bad(); len(bad) > 0 {
		t.Errorf("undecodable requests: %v", bad)
	}
}

func TestExtractAcceptsCanonicalizedKeys(t *testing.T) {
	h := map[string][]string{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), h))
	if !sc.IsValid() || sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("Extract of a canonicalized header = %v", sc)
	}
	// Garbage is ignored, never a panic.
	for _, v := range []string{"", "00-zz", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", "00-00000000000000000000000000000000-b7ad6b7169203331-01"} {
		if sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), map[string][]string{"traceparent": {v}})); sc.IsValid() {
			t.Errorf("Extract(%q) gave a valid context %v", v, sc)
		}
	}
}

func TestSeededRootsShareTheirTraceID(t *testing.T) {
	rcv := otlptest.New(t)
	p, err := telemetry.FromEnv(context.Background(), "floe-engine", env(map[string]string{telemetry.EnvEndpoint: rcv.URL}))
	if err != nil {
		t.Fatal(err)
	}
	// Two engines start the same Task, one after the other's crash.
	ctx := telemetry.WithTraceSeed(context.Background(), "task-1")
	_, a := p.Tracer().Start(ctx, "invoke_agent")
	_, b := p.Tracer().Start(ctx, "invoke_agent")
	_, other := p.Tracer().Start(telemetry.WithTraceSeed(context.Background(), "task-2"), "invoke_agent")
	_, random := p.Tracer().Start(context.Background(), "x")
	want := telemetry.SeededTraceID("task-1")
	if a.SpanContext().TraceID() != want || b.SpanContext().TraceID() != want {
		t.Errorf("seeded roots %s, %s; want %s", a.SpanContext().TraceID(), b.SpanContext().TraceID(), want)
	}
	if a.SpanContext().SpanID() == b.SpanContext().SpanID() {
		t.Error("two spans share a span id")
	}
	if other.SpanContext().TraceID() == want || random.SpanContext().TraceID() == want {
		t.Error("another seed or no seed gave the same trace id")
	}
	for _, s := range []trace.Span{a, b, other, random} {
		s.End()
	}
	_ = p.Shutdown(context.Background())
}

func TestTracesEndpointAloneExportsTracesOnly(t *testing.T) {
	rcv := otlptest.New(t)
	p, err := telemetry.FromEnv(context.Background(), "floe-x", env(map[string]string{telemetry.EnvTracesEndpoint: rcv.URL + "/v1/traces"}))
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer().Start(context.Background(), "x")
	span.End()
	p.RecordChat(context.Background(), time.Second, 1, 1, "")
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(rcv.Spans()); n != 1 {
		t.Errorf("%d spans, want 1", n)
	}
	if m := rcv.Metrics(); len(m) != 0 {
		t.Errorf("metrics %v exported without a metrics endpoint", m)
	}
}
