package engine

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"floe.dev/pkg/bus/ops"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// metrics are the engine's series.
type metrics struct {
	tasks     prometheus.Gauge
	outcomes  *prometheus.CounterVec
	requests  *prometheus.HistogramVec
	ttft      *prometheus.HistogramVec
	reconnect prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	return &metrics{
		tasks: ops.MustRegister(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "floe_engine_tasks_running", Help: "Tasks this engine runs now.",
		})),
		outcomes: ops.MustRegister(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floe_engine_tasks_total", Help: "Tasks ended, by outcome.",
		}, []string{"status"})),
		requests: ops.MustRegister(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "floe_engine_model_request_duration_seconds",
			Help:    "Model requests from start to the end of the stream, by provider and status (completed, failed, timeout, malformed, auth, aborted).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 12),
		}, []string{"provider", "status"})),
		ttft: ops.MustRegister(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "floe_engine_model_time_to_first_token_seconds",
			Help:    "From sending a model request to its first streamed delta, by provider.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
		}, []string{"provider"})),
		reconnect: ops.MustRegister(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "floe_engine_model_reconnects_total", Help: "Model requests that failed with a retryable status (the engine reconnects unless its attempts are spent).",
		})),
	}
}

// measuredProvider times a provider's requests.
type measuredProvider struct {
	model.Provider
	name string
	m    *metrics
}

func (p measuredProvider) Stream(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	began := time.Now()
	var once sync.Once
	res, err := p.Provider.Stream(ctx, req, func(d model.Delta) error {
		once.Do(func() { p.m.ttft.WithLabelValues(p.name).Observe(time.Since(began).Seconds()) })
		return emit(d)
	})
	status := omni.StatusCompleted
	if err != nil {
		status = model.StatusOf(err)
	} else if res.StopReason != "" {
		status = res.StopReason
	}
	switch status {
	case omni.StatusFailed, omni.StatusTimeout, omni.StatusMalformed:
		p.m.reconnect.Inc()
	}
	p.m.requests.WithLabelValues(p.name, status).Observe(time.Since(began).Seconds())
	return res, err
}
