package tracer_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	tt "floe.dev/services/tracer/internal/tracertest"
)

// One Session whose Trace cannot be written (its file's path is taken by a
// directory: refused even to root) never stops the others: they are traced
// while it is set aside, the metrics name it and show the lag, and once the
// path is free its Trace catches up with every record, in order — also
// when a new tracer takes over meanwhile (the set is kept on disk).
func TestAFailingSessionDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	const bad = "session-2026-11-29-20-10-22-0000bad0"
	const good = "session-2026-11-29-20-10-22-00009009"
	created, _ := omni.SessionCreated(bad)
	blocker := trace.File(home, created, bad, 1)
	if err := os.MkdirAll(blocker, 0o755); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := config(home)
	cfg.Metrics = reg
	cfg.RetryMin, cfg.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	var logs bustest.Buffer
	first := start(t, env, cfg, zerolog.New(&logs))

	tt.Publish(t, env.JS, tt.Msg(t, bad, tt.Meta(bad)), tt.Msg(t, bad, omni.UserText("lost?")))
	tt.Publish(t, env.JS, tt.Msg(t, good, tt.Meta(good)), tt.Msg(t, good, omni.UserText("one")))
	tt.WaitTrace(t, env.JS, home, good)
	tt.Publish(t, env.JS, tt.Msg(t, bad, omni.UserText("while stuck")), tt.Msg(t, good, omni.UserText("two")))
	tt.WaitTrace(t, env.JS, home, good)

	bustest.Eventually(t, 10*time.Second, "the stuck Session in the metrics", func() bool {
		return testutil.ToFloat64(gauge(t, reg, "floe_tracer_stuck_sessions")) == 1
	})
	out := gatherText(t, reg)
	if !strings.Contains(out, `floe_tracer_stuck_session_behind_since{session_id="`+bad+`"}`) {
		t.Errorf("metrics do not name the stuck Session:\n%s", out)
	}
	bustest.Eventually(t, 10*time.Second, "the lag to show", func() bool {
		return testutil.ToFloat64(gauge(t, reg, "floe_tracer_lag_seconds")) > 0.2
	})
	if !strings.Contains(logs.String(), "other Sessions go on") || !strings.Contains(logs.String(), bad) {
		t.Errorf("the stuck Session is not logged:\n%s", logs.String())
	}

	// A new tracer takes over while it is stuck, then the path frees.
	first.stop()
	reg2 := prometheus.NewRegistry()
	cfg.Metrics = reg2
	start(t, env, cfg, zerolog.New(&logs))
	tt.Publish(t, env.JS, tt.Msg(t, good, omni.UserText("three")))
	tt.WaitTrace(t, env.JS, home, good)
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	tt.Publish(t, env.JS, tt.Msg(t, bad, omni.UserText("after")))
	tt.WaitTrace(t, env.JS, home, bad)
	bustest.Eventually(t, 10*time.Second, "no stuck Session left", func() bool {
		return testutil.ToFloat64(gauge(t, reg2, "floe_tracer_stuck_sessions")) == 0
	})
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return collectorFunc{reg: reg, name: name}
}

// collectorFunc re-exposes one gathered series for testutil.ToFloat64.
type collectorFunc struct {
	reg  *prometheus.Registry
	name string
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	ch <- prometheus.NewDesc(c.name, "copy", nil, nil)
}

func (c collectorFunc) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := c.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != c.name || len(mf.Metric) == 0 {
			continue
		}
		m := mf.Metric[0]
		v := m.GetGauge().GetValue()
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(c.name, "copy", nil, nil), prometheus.GaugeValue, v)
		return
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(c.name, "copy", nil, nil), prometheus.GaugeValue, -1)
}

func gatherText(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			b.WriteString(mf.GetName() + "{")
			for _, l := range m.Label {
				b.WriteString(l.GetName() + `="` + l.GetValue() + `"`)
			}
			b.WriteString("}\n")
		}
	}
	return b.String()
}
