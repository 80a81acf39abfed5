// Package telemetry is Floe's OpenTelemetry: one Provider per service,
// configured by the standard OTEL_* variables and off unless
// OTEL_EXPORTER_OTLP_ENDPOINT (or its traces variant) is set; spans and
// attributes named after the GenAI semantic conventions; and the carriers
// that move a trace context across the bus (NATS message headers) and
// into MCP requests (params._meta), so one Task is one trace across
// processes (docs/protocol.md §9).
//
// A nil *Provider, and one made by Off, does nothing and costs nothing:
// its tracer is a no-op and no connection is ever made.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Environment variables read by FromEnv (the OTLP exporters read the rest
// of the OTEL_EXPORTER_OTLP_* family themselves: headers, timeout, …).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvCaptureContent = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
)

// instrumentation is the scope name of every span and metric Floe makes.
const instrumentation = "floe.dev"

// Provider is one service's tracer and GenAI metrics. Its methods are safe
// for concurrent use, and on a nil Provider.
type Provider struct {
	tp      *sdktrace.TracerProvider
	mp      *sdkmetric.MeterProvider
	tracer  trace.Tracer
	capture bool

	tokenUsage metric.Int64Histogram
	opDuration metric.Float64Histogram
}

// Off returns a Provider that records nothing.
func Off() *Provider { return nil }

// Enabled reports whether p exports anything.
func Enabled(p *Provider) bool { return p != nil && p.tp != nil }

// FromEnv returns the Provider of the service named service ("floe-engine",
// …; OTEL_SERVICE_NAME overrides it) as the environment configures it: Off
// when no OTLP endpoint is set or OTEL_SDK_DISABLED is true, else OTLP over
// HTTP (protobuf) to that endpoint, batched, with the sampler of
// OTEL_TRACES_SAMPLER (default: parent-based, always on). Nothing connects
// before the first export. getenv is os.Getenv outside tests.
func FromEnv(ctx context.Context, service string, getenv func(string) string) (*Provider, error) {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return Off(), nil
	}
	if getenv(EnvEndpoint) == "" && getenv(EnvTracesEndpoint) == "" {
		return Off(), nil
	}
	switch p := strings.TrimSpace(getenv(EnvProtocol)); p {
	case "", "http/protobuf":
	default:
		return nil, fmt.Errorf("telemetry: %s=%q: only http/protobuf is supported", EnvProtocol, p)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	// The endpoint comes from getenv (the rest of the OTEL_EXPORTER_OTLP_*
	// family the exporters read from the process themselves).
	spans, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(signalURL(getenv, EnvTracesEndpoint, "/v1/traces")))
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithIDGenerator(idGenerator{}),
		sdktrace.WithBatcher(spans, sdktrace.WithBatchTimeout(time.Second)))
	p := &Provider{tp: tp, tracer: tp.Tracer(instrumentation),
		capture: strings.EqualFold(strings.TrimSpace(getenv(EnvCaptureContent)), "true")}

	meter := metricnoop.NewMeterProvider().Meter(instrumentation)
	if metricsEnabled(getenv) {
		exp, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(signalURL(getenv, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "/v1/metrics")))
		if err != nil {
			_ = tp.Shutdown(ctx)
			return nil, fmt.Errorf("telemetry: OTLP metric exporter: %w", err)
		}
		p.mp = sdkmetric.NewMeterProvider(sdkmetric.WithResource(res),
			sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(10*time.Second))))
		meter = p.mp.Meter(instrumentation)
	}
	// The GenAI client metrics, with the conventions' names, units and
	// bucket boundaries.
	p.tokenUsage, err = meter.Int64Histogram("gen_ai.client.token.usage",
		metric.WithUnit("{token}"), metric.WithDescription("Number of input and output tokens used."),
		metric.WithExplicitBucketBoundaries(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864))
	if err != nil {
		return nil, err
	}
	p.opDuration, err = meter.Float64Histogram("gen_ai.client.operation.duration",
		metric.WithUnit("s"), metric.WithDescription("GenAI operation duration."),
		metric.WithExplicitBucketBoundaries(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92))
	if err != nil {
		return nil, err
	}
	return p, nil
}

// signalURL is a signal's export URL as the OTLP spec builds it: the
// signal's own variable as given, else the base endpoint with the signal's
// path appended.
func signalURL(getenv func(string) string, signalVar, path string) string {
	if u := strings.TrimSpace(getenv(signalVar)); u != "" {
		return u
	}
	return strings.TrimRight(strings.TrimSpace(getenv(EnvEndpoint)), "/") + path
}

// metricsEnabled: metrics go to the same endpoint unless the standard
// OTEL_METRICS_EXPORTER says none.
func metricsEnabled(getenv func(string) string) bool {
	if strings.TrimSpace(getenv("OTEL_METRICS_EXPORTER")) == "none" {
		return false
	}
	return getenv(EnvEndpoint) != "" || getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != ""
}

// Tracer returns the service's tracer (a no-op one when off).
func (p *Provider) Tracer() trace.Tracer {
	if p == nil || p.tracer == nil {
		return tracenoop.NewTracerProvider().Tracer(instrumentation)
	}
	return p.tracer
}

// CaptureContent reports whether message content may be put on spans
// (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true).
func (p *Provider) CaptureContent() bool { return p != nil && p.capture }

// RecordChat records one model request in the GenAI client metrics: its
// duration and, when known, its input and output tokens. attrs are the
// request's gen_ai.* attributes (operation, provider, model).
func (p *Provider) RecordChat(ctx context.Context, d time.Duration, input, output int64, errType string, attrs ...attribute.KeyValue) {
	if p == nil || p.tokenUsage == nil {
		return
	}
	durAttrs := attrs
	if errType != "" {
		durAttrs = append(append([]attribute.KeyValue(nil), attrs...), attribute.String("error.type", errType))
	}
	p.opDuration.Record(ctx, d.Seconds(), metric.WithAttributes(durAttrs...))
	if input > 0 || output > 0 {
		in := append(append([]attribute.KeyValue(nil), attrs...), TokenType.String("input"))
		out := append(append([]attribute.KeyValue(nil), attrs...), TokenType.String("output"))
		p.tokenUsage.Record(ctx, input, metric.WithAttributes(in...))
		p.tokenUsage.Record(ctx, output, metric.WithAttributes(out...))
	}
}

// Shutdown flushes what is buffered and stops the exporters, within ctx.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.tp == nil {
		return nil
	}
	err := p.tp.Shutdown(ctx)
	if p.mp != nil {
		err = errors.Join(err, p.mp.Shutdown(ctx))
	}
	return err
}

// ForceFlush exports every finished span now (tests, and before a
// process hands its work over).
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil || p.tp == nil {
		return nil
	}
	return p.tp.ForceFlush(ctx)
}

// propagator is W3C Trace Context plus Baggage, as every OTel SDK speaks.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Header is a NATS message header (nats.Header is this type), as a carrier
// of trace context. Keys are written as the W3C spells them
// ("traceparent"), so `nats` CLI users see them plainly.
type Header map[string][]string

// Get implements propagation.TextMapCarrier.
func (h Header) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h { // a peer that canonicalized the key
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// Set implements propagation.TextMapCarrier.
func (h Header) Set(key, value string) { h[key] = []string{value} }

// Keys implements propagation.TextMapCarrier.
func (h Header) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes ctx's span context into h (a nats.Header); nothing when
// ctx carries no recording span.
func Inject(ctx context.Context, h map[string][]string) {
	if h == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, Header(h))
}

// Extract returns ctx with the remote span context h carries, if any.
func Extract(ctx context.Context, h map[string][]string) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, Header(h))
}

// InjectMeta writes ctx's span context into an MCP request's _meta map
// (the "traceparent" key, and "tracestate" when set).
func InjectMeta(ctx context.Context, meta map[string]any) {
	if meta == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	for k, v := range c {
		meta[k] = v
	}
}

// Run runs f with the Provider of service as the environment configures
// it (FromEnv with os.Getenv), then flushes and stops it within 5 s: the
// wiring of a service's main.
func Run(ctx context.Context, service string, getenv func(string) string, f func(*Provider) error) error {
	p, err := FromEnv(ctx, service, getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(sctx)
	}()
	return f(p)
}
