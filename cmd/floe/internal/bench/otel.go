package bench

import (
	"context"
	"fmt"
	"os"

	"floe.dev/pkg/telemetry"
	"floe.dev/pkg/telemetry/otlptest"
)

// OTelResult is the cost of OpenTelemetry tracing (docs/protocol.md §9):
// the engine → SSE throughput of two Floes side by side, one exporting
// every span and metric to a local OTLP/HTTP receiver, the other with
// tracing off, run back to back Runs times.
type OTelResult struct {
	Runs     int
	Off, On  float64   // median partials/s, engine → SSE
	Ratios   []float64 // on ÷ off of each pair
	Spans    int       // spans the receiver decoded
	Requests int       // export requests it got
}

// Ratio is the median of the per-pair ratios (tracing on ÷ off).
func (r *OTelResult) Ratio() float64 { return median(r.Ratios) }

func runOTel(ctx context.Context, c *Config, p *progress) (*OTelResult, error) {
	off, err := startEnv(ctx, c.root, "otel-off", true, c.Log)
	if err != nil {
		return nil, err
	}
	defer off.stop()
	rcv := otlptest.Start()
	defer rcv.Close()
	// The stack and the gateway read the standard variable when they
	// start; the second env starts with it set.
	prev, had := os.LookupEnv(telemetry.EnvEndpoint)
	os.Setenv(telemetry.EnvEndpoint, rcv.URL)
	on, err := startEnv(ctx, c.root, "otel-on", true, c.Log)
	if had {
		os.Setenv(telemetry.EnvEndpoint, prev)
	} else {
		os.Unsetenv(telemetry.EnvEndpoint)
	}
	if err != nil {
		return nil, err
	}
	defer on.stop()
	if !telemetry.Enabled(on.tel) {
		return nil, fmt.Errorf("bench: the traced env did not enable telemetry")
	}
	blocks := max(c.Partials/chunksPerText, 1)
	refOff, err := writeScript(off.home, blocks)
	if err != nil {
		return nil, err
	}
	refOn, err := writeScript(on.home, blocks)
	if err != nil {
		return nil, err
	}
	res := &OTelResult{Runs: c.Runs}
	var offs, ons []float64
	run := func(i int, name string, e *env, ref string) (float64, error) {
		p.logf("otel run %d/%d: tracing %s", i+1, c.Runs, name)
		r, err := engineRun(ctx, e, ref)
		if err != nil {
			return 0, err
		}
		return r.sse, nil
	}
	for i := range c.Runs {
		// Alternate which goes first, so neither gains from the order.
		var a, b float64
		var err error
		if i%2 == 0 {
			if a, err = run(i, "off", off, refOff); err == nil {
				b, err = run(i, "on", on, refOn)
			}
		} else if b, err = run(i, "on", on, refOn); err == nil {
			a, err = run(i, "off", off, refOff)
		}
		if err != nil {
			return nil, err
		}
		offs, ons = append(offs, a), append(ons, b)
		res.Ratios = append(res.Ratios, b/a)
	}
	res.Off, res.On = median(offs), median(ons)
	// What the traced Floe exported, flushed.
	on.flushTelemetry(ctx)
	res.Spans, res.Requests = len(rcv.Spans()), rcv.Requests()
	if res.Spans == 0 {
		return nil, fmt.Errorf("bench: tracing on, but the receiver got no span")
	}
	return res, nil
}
