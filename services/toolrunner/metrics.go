package toolrunner

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"floe.dev/pkg/bus/ops"
	"floe.dev/pkg/omni"
	"floe.dev/services/toolrunner/internal/runner"
	"floe.dev/services/toolrunner/internal/tools"
)

// metrics are the toolrunner's series.
type metrics struct {
	tools   *prometheus.HistogramVec
	running prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	return &metrics{
		tools: ops.MustRegister(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "floe_toolrunner_tool_duration_seconds",
			Help:    "Tool call durations, by tool and status (completed, failed, aborted).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"tool", "status"})),
		running: ops.MustRegister(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "floe_toolrunner_tools_running", Help: "Tool calls running now.",
		})),
	}
}

// measured times every call of a Toolbox.
type measured struct {
	runner.Toolbox
	m *metrics
}

func (t measured) Execute(ctx context.Context, call tools.Call, emit tools.Emit) tools.Result {
	t.m.running.Inc()
	defer t.m.running.Dec()
	began := time.Now()
	res := t.Toolbox.Execute(ctx, call, emit)
	status := omni.StatusCompleted
	switch {
	case errors.Is(context.Cause(ctx), context.Canceled) || ctx.Err() != nil:
		status = omni.StatusAborted
	case res.Failed:
		status = omni.StatusFailed
	}
	t.m.tools.WithLabelValues(call.Name, status).Observe(time.Since(began).Seconds())
	return res
}
