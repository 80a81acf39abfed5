package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"floe.dev/pkg/bus/ops"
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
	sseCatchUps   prometheus.Counter
	sseLatency    prometheus.Histogram
	undecodable   prometheus.Gauge

	signInFailures *prometheus.CounterVec
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
		sseSlow:       prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_gateway_sse_slow_disconnects_total", Help: "SSE clients disconnected as too slow: their buffer filled or a write took longer than the write timeout."}),
		sseCatchUps:   prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_gateway_sse_catch_ups_total", Help: "Times a connection still replaying its gap fell more than its buffer behind and caught up from JetStream again."}),
		sseLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "floe_gateway_publish_to_sse_seconds",
			Help:    "From a message's storage in FLOE_SESSIONS to its write to an SSE client (live events; replayed gaps are not counted).",
			Buckets: latencyBuckets,
		}),
	}
	m.requests = ops.MustRegister(reg, m.requests)
	m.sseClients = ops.MustRegister(reg, m.sseClients)
	m.sseSessions = ops.MustRegister(reg, m.sseSessions)
	m.sseConnected = ops.MustRegister(reg, m.sseConnected)
	m.sseEvents = ops.MustRegister(reg, m.sseEvents)
	m.sseReplayed = ops.MustRegister(reg, m.sseReplayed)
	m.sseResyncs = ops.MustRegister(reg, m.sseResyncs)
	m.sseReconnects = ops.MustRegister(reg, m.sseReconnects)
	m.sseSlow = ops.MustRegister(reg, m.sseSlow)
	m.sseCatchUps = ops.MustRegister(reg, m.sseCatchUps)
	m.sseLatency = ops.MustRegister(reg, m.sseLatency)
	m.signInFailures = ops.MustRegister(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "floe_gateway_auth_failures_total", Help: "Failed authentications, by method (bearer, sign-in).",
	}, []string{"method"}))
	m.undecodable = ops.MustRegister(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "floe_gateway_undecodable_session_records",
		Help: "Session records that do not decode, skipped by the last session list (each is logged once; DELETE removes one).",
	}))
	return m
}

func (m *metrics) request(route string, status int) {
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
}
