// Package otlptest is an OTLP/HTTP receiver for tests: a real HTTP server
// on loopback that decodes the protobuf export requests of traces and
// metrics, as a collector would, and keeps what it got for assertions.
package otlptest

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened.
type Span struct {
	Service      string // the resource's service.name
	TraceID      string // hex
	SpanID       string
	ParentSpanID string // "" for a root
	Name         string
	Kind         string
	Attrs        map[string]any // string, int64, float64, bool or []any
	StatusCode   string
	Start, End   time.Time
}

// Attr returns the span's attribute key as a string ("" when absent).
func (s Span) Attr(key string) string {
	v, ok := s.Attrs[key]
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

// Receiver collects what OTLP exporters send to URL.
type Receiver struct {
	URL string // the endpoint to give as OTEL_EXPORTER_OTLP_ENDPOINT

	srv *httptest.Server

	mu       sync.Mutex
	spans    []Span
	metrics  map[string]int // metric name → data points received
	requests int
	bad      []string // requests that did not decode
}

// New starts a receiver; it stops when the test ends.
func New(t testing.TB) *Receiver {
	r := Start()
	t.Cleanup(r.Close)
	return r
}

// Start starts a receiver on a loopback port (benchmarks); Close stops it.
func Start() *Receiver {
	r := &Receiver{metrics: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.srv.URL
	return r
}

// Close stops the receiver.
func (r *Receiver) Close() { r.srv.Close() }

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		r.bad = append(r.bad, req.URL.Path+": content type "+ct)
		http.Error(w, "want application/x-protobuf", http.StatusUnsupportedMediaType)
		return
	}
	switch req.URL.Path {
	case "/v1/traces":
		var m coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &m); err != nil {
			r.bad = append(r.bad, "traces: "+err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.addSpans(&m)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	case "/v1/metrics":
		var m colmetricpb.ExportMetricsServiceRequest
		if err := proto.Unmarshal(body, &m); err != nil {
			r.bad = append(r.bad, "metrics: "+err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rm := range m.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, mt := range sm.Metrics {
					n := 0
					if h := mt.GetHistogram(); h != nil {
						n = len(h.DataPoints)
					} else if s := mt.GetSum(); s != nil {
						n = len(s.DataPoints)
					} else if g := mt.GetGauge(); g != nil {
						n = len(g.DataPoints)
					}
					r.metrics[mt.Name] += n
				}
			}
		}
		out, _ := proto.Marshal(&colmetricpb.ExportMetricsServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	default:
		r.bad = append(r.bad, "unknown path "+req.URL.Path)
		http.NotFound(w, req)
	}
}

func (r *Receiver) addSpans(m *coltracepb.ExportTraceServiceRequest) {
	for _, rs := range m.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := Span{Service: service, TraceID: hex.EncodeToString(s.TraceId), SpanID: hex.EncodeToString(s.SpanId),
					Name: s.Name, Kind: s.Kind.String(), Attrs: map[string]any{},
					StatusCode: s.GetStatus().GetCode().String(),
					Start:      time.Unix(0, int64(s.StartTimeUnixNano)), End: time.Unix(0, int64(s.EndTimeUnixNano))}
				if len(s.ParentSpanId) > 0 {
					sp.ParentSpanID = hex.EncodeToString(s.ParentSpanId)
				}
				for _, kv := range s.Attributes {
					sp.Attrs[kv.Key] = value(kv.Value)
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.Values {
			out = append(out, value(e))
		}
		return out
	}
	return nil
}

// Spans returns a copy of every span received so far, ordered by start.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	out := append([]Span(nil), r.spans...)
	r.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Requests is the number of export requests received (any path).
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// Metrics returns the names of the metrics received with their data point
// counts.
func (r *Receiver) Metrics() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.metrics))
	for k, v := range r.metrics {
		out[k] = v
	}
	return out
}

// Bad returns the requests that did not decode.
func (r *Receiver) Bad() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

// WaitFor polls until cond holds for the spans received, or fails the test
// after timeout with what it has.
func (r *Receiver) WaitFor(t testing.TB, timeout time.Duration, what string, cond func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := r.Spans()
		if cond(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			var names []string
			for _, s := range spans {
				names = append(names, s.Service+"/"+s.Name)
			}
			t.Fatalf("timed out after %v waiting for %s; got %d spans: %v (bad requests: %v)", timeout, what, len(spans), names, r.Bad())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
