package server

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// metrics holds the gateway's counters; /metrics writes them in the
// Prometheus text exposition format (hand-written: a handful of series do
// not justify a client library).
type metrics struct {
	mu       sync.Mutex
	requests map[reqKey]uint64 // guarded by mu

	sseClients   atomic.Int64
	sseEvents    atomic.Uint64
	sseSlow      atomic.Uint64
	sseResyncs   atomic.Uint64
	sseReplayed  atomic.Uint64
	sseConnected atomic.Uint64
}

type reqKey struct {
	route  string
	status int
}

func newMetrics() *metrics { return &metrics{requests: make(map[reqKey]uint64)} }

func (m *metrics) request(route string, status int) {
	m.mu.Lock()
	m.requests[reqKey{route, status}]++
	m.mu.Unlock()
}

// write emits every series in the text exposition format, version 0.0.4.
func (m *metrics) write(w io.Writer) error {
	m.mu.Lock()
	keys := make([]reqKey, 0, len(m.requests))
	for k := range m.requests {
		keys = append(keys, k)
	}
	counts := make(map[reqKey]uint64, len(keys))
	for _, k := range keys {
		counts[k] = m.requests[k]
	}
	m.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].route != keys[j].route {
			return keys[i].route < keys[j].route
		}
		return keys[i].status < keys[j].status
	})

	var b strings.Builder
	b.WriteString("# HELP floe_gateway_http_requests_total HTTP requests served, by route pattern and status code.\n")
	b.WriteString("# TYPE floe_gateway_http_requests_total counter\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "floe_gateway_http_requests_total{route=\"%s\",status=\"%d\"} %d\n", escapeLabel(k.route), k.status, counts[k])
	}
	gauge := func(name, help string, v int64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v)
	}
	counter := func(name, help string, v uint64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s %s\n", name, help, name, name, strconv.FormatUint(v, 10))
	}
	gauge("floe_gateway_sse_clients", "SSE connections currently open.", m.sseClients.Load())
	counter("floe_gateway_sse_connections_total", "SSE connections accepted.", m.sseConnected.Load())
	counter("floe_gateway_sse_events_sent_total", "SSE events written to clients (stream events, snapshots and re-sent approvals).", m.sseEvents.Load())
	counter("floe_gateway_sse_replayed_events_total", "SSE events sent while replaying a Last-Event-ID gap.", m.sseReplayed.Load())
	counter("floe_gateway_sse_resync_total", "SSE reconnects answered with resync_required.", m.sseResyncs.Load())
	counter("floe_gateway_sse_slow_disconnects_total", "SSE clients disconnected because their buffer filled.", m.sseSlow.Load())
	_, err := io.WriteString(w, b.String())
	return err
}

func escapeLabel(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return r.Replace(s)
}
