package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// LowRateResult is the tracer's share of a streaming Session's cost
// (issue 27, tracer_share_low_rate): one Session whose Task streams Deltas
// text deltas through the engine at about 500 a second (a scripted model
// pausing 2 ms before each), in a Floe with the tracer and in one without
// it, alternately, Runs times each. The figure is the process's CPU over
// the Task (engine, embedded nats-server, the idle gateway and toolrunner,
// and the tracer when there is one), submit → task_state idle read from
// the bus (no SSE client, whose cost would blur the tracer's).
type LowRateResult struct {
	Deltas, Runs int
	// Rate is the partials per second the Tasks published (median).
	Rate float64
	// With and Without are the median CPU per Task.
	With, Without time.Duration
}

// Share is tracer_share_low_rate: the CPU with the tracer ÷ without it.
func (r *LowRateResult) Share() float64 { return float64(r.With) / float64(r.Without) }

// lowRateDelay is the scripted model's pause before each delta: 500/s.
const lowRateDelay = 2

func runLowRate(ctx context.Context, c *Config, p *progress) (*LowRateResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	res := &LowRateResult{Deltas: c.LowRateDeltas, Runs: c.LowRateRuns}
	var with, without []time.Duration
	var rates []float64
	for i := range 2 * res.Runs {
		traced := i%2 == 1
		cpu, rate, err := lowRateTask(ctx, c, i, traced, res.Deltas)
		if err != nil {
			return nil, err
		}
		if traced {
			with = append(with, cpu)
		} else {
			without = append(without, cpu)
		}
		rates = append(rates, rate)
		p.logf("lowrate: run %d, tracer %v: %v CPU, %.0f partials/s", i/2+1, traced, cpu.Round(time.Millisecond), rate)
	}
	med := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	res.With, res.Without, res.Rate = med(with), med(without), median(rates)
	return res, nil
}

// lowRateTask runs one Task of deltas partials in a fresh Floe (with the
// tracer or without) and returns the process CPU it took and the partials
// per second it published.
func lowRateTask(ctx context.Context, c *Config, run int, traced bool, deltas int) (time.Duration, float64, error) {
	e, err := startEnvTuned(ctx, c.root, fmt.Sprintf("lowrate-%d", run), true, "", func(o *stack.Options) {
		if !traced {
			o.Tracer = nil
		}
	}, c.Log)
	if err != nil {
		return 0, 0, err
	}
	defer e.stop()
	script := map[string]any{
		"requests": []any{map[string]any{
			"steps": []any{map[string]any{"text": strings.Repeat("x", deltas), "chunks": deltas, "delay_ms": lowRateDelay}},
		}},
		"after_last": "repeat_last",
	}
	b, err := json.Marshal(script)
	if err != nil {
		return 0, 0, err
	}
	path := filepath.Join(e.home, "lowrate-script.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return 0, 0, fmt.Errorf("bench: write script: %w", err)
	}
	s, err := e.api.CreateSession(ctx, client.CreateSession{Model: "scripted:" + path})
	if err != nil {
		return 0, 0, fmt.Errorf("bench: create session: %w", err)
	}
	events := make(chan *nats.Msg, 64)
	sub, err := e.nc.ChanSubscribe(omni.SessionSubject(s.ID, omni.ClassServer), events)
	if err != nil {
		return 0, 0, fmt.Errorf("bench: subscribe: %w", err)
	}
	defer sub.Unsubscribe()
	t0, c0 := time.Now(), processCPU()
	id, err := e.api.SubmitTask(ctx, s.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "stream"}}})
	if err != nil {
		return 0, 0, fmt.Errorf("bench: task: %w", err)
	}
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for idle := false; !idle; {
		select {
		case m := <-events:
			var se omni.ServerEvent
			idle = json.Unmarshal(m.Data, &se) == nil && se.Type == omni.ServerTaskState && se.State == omni.StateIdle && se.TaskID == id
		case <-deadline.C:
			return 0, 0, fmt.Errorf("bench: lowrate task: no task_state idle within a minute")
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
	cpu, elapsed := processCPU()-c0, time.Since(t0)
	st, err := e.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return 0, 0, err
	}
	partials := omni.SessionSubject(s.ID, omni.ClassPartial)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(partials))
	if err != nil {
		return 0, 0, err
	}
	return cpu, float64(info.State.Subjects[partials]) / elapsed.Seconds(), nil
}
