package server

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's series, registered on the Registerer the
// gateway was given (Options.Metrics) and served on /metrics.
type metrics struct {
	requests *prometheus.CounterVec

	sseClients    prometheus.Gauge
	sseSessions   prometheus.Gauge
	sseConnected  prometheus.Counter
	sseEvents     prometheus.Counter
	sseReplayed   prometheus.Counter
	sseResyncs    prometheus.Counter
	sseReconnects prometheus.Counter
	sseSlow       prometheus.Counter
	sseLatency    prometheus.Histogram
}

// latencyBuckets cover 50 µs to about 1.6 s.
var latencyBuckets = prometheus.ExponentialBuckets(50e-6, 2, 16)

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floe_gateway_http_requests_total", Help: "HTTP requests served, by route pattern and status code.",
		}, []string{"route", "status"}),
		sseClients:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "floe_gateway_sse_clients", Help: "SSE connections currently open."}),
		sseSessions:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "floe_gateway_sse_sessions", Help: "Sessions with at least one SSE client on this gateway."}),
		sseConnected:  prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_gateway_sse_connections_total", Help: "SSE connections accepted."}),
		sseEvents:     prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_gateway_sse_events_sent_total", Help: "SSE events written to clients (stream events, snapshots and re-sent approvals)."}),
		sseReplayed:   prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_gateway_sse_replayed_events_total", Help: "SSE events sent while replaying a Last-Event-ID gap."}),
		sseResyncs:    prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_gateway_sse_resync_total", Help: "SSE reconnects answered with resync_required."}),
		sseReconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_gateway_sse_reconnects_total", Help: "SSE connections that came with a Last-Event-ID."}),
		sseSlow:       prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_gateway_sse_slow_disconnects_total", Help: "SSE clients disconnected because their buffer filled."}),
		sseLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "floe_gateway_publish_to_sse_seconds",
			Help:    "From a message's storage in FLOE_SESSIONS to its write to an SSE client (live events; replayed gaps are not counted).",
			Buckets: latencyBuckets,
		}),
	}
	m.requests = register(reg, m.requests)
	m.sseClients = register(reg, m.sseClients)
	m.sseSessions = register(reg, m.sseSessions)
	m.sseConnected = register(reg, m.sseConnected)
	m.sseEvents = register(reg, m.sseEvents)
	m.sseReplayed = register(reg, m.sseReplayed)
	m.sseResyncs = register(reg, m.sseResyncs)
	m.sseReconnects = register(reg, m.sseReconnects)
	m.sseSlow = register(reg, m.sseSlow)
	m.sseLatency = register(reg, m.sseLatency)
	return m
}

// register registers c, or returns the collector already registered under
// its name: two gateways on one registry share their series.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
	}
	return c
}

func (m *metrics) request(route string, status int) {
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
}
