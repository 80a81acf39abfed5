package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// TasksIdleResult is what an idle Session costs after a real Task: each
// Session created through the API and given one short Task that the engine
// runs (a scripted model answering with one text), traced, no client
// attached. The nats-server runs in a process of its own (a broker child),
// as in a deployment, so the Floe services' memory and the broker's are
// measured apart; both at idleWait and settledWait after the last Task.
type TasksIdleResult struct {
	Sessions int
	Run      time.Duration // creating the Sessions and running every Task
	// Mem is per Session, the Floe process (engine, toolrunner, tracer,
	// gateway and the benchmark's client), settledWait after the last
	// Task; Broker the same of the nats-server process.
	Mem, Broker memDelta
	// MemAtWait and BrokerAtWait are the same idleWait after the last
	// Task, while the broker still holds the block caches of the last
	// Tasks.
	MemAtWait, BrokerAtWait memDelta
	// ConsumersAfter is the number of consumers on FLOE_SESSIONS left
	// idleWait after the last Task (the tracer's durable is one of them);
	// ConsumersDuring its peak while the Tasks ran.
	ConsumersAfter, ConsumersBefore, ConsumersPeak int
	Wait                                           time.Duration
	// Warmup is how many Sessions ran their Task before the first
	// snapshot (their memory is not counted).
	Warmup int
}

// RSS is the whole deployment's RSS per idle Session (both processes) at
// settledWait, and RSSAtWait at idleWait.
func (r *TasksIdleResult) RSS() float64       { return r.Mem.RSS + r.Broker.RSS }
func (r *TasksIdleResult) RSSAtWait() float64 { return r.MemAtWait.RSS + r.BrokerAtWait.RSS }

// idleWait is how long after the last Task the first figures are taken
// ("within 10 s"); settledWait the second: by then nats-server's file store
// has dropped the block caches of the streams the last Tasks wrote (10 s
// after a block's last access, on a 100 ms tick; the tracer reads the last
// messages a little after the Task ends). Those caches hold up to a block
// (8 MiB for FLOE_SESSIONS) per stream written in the last 10 s, whatever
// the number of Sessions.
const (
	idleWait    = 10 * time.Second
	settledWait = cacheExpiry + time.Second
)

// writeAnswerScript writes a scripted model of one request that answers
// with one short text.
func writeAnswerScript(home string) (string, error) {
	script := map[string]any{
		"requests": []any{map[string]any{
			"steps": []any{map[string]any{"text": "The folder holds a Go module with a README and two packages; nothing else stands out."}},
			"usage": map[string]int{"output": 24, "total": 1210},
		}},
		"after_last": "repeat_last",
	}
	b, err := json.Marshal(script)
	if err != nil {
		return "", err
	}
	path := filepath.Join(home, "answer-script.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", fmt.Errorf("bench: write script: %w", err)
	}
	return "scripted:" + path, nil
}

func streamConsumers(ctx context.Context, e *env) (int, error) {
	s, err := e.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Consumers, nil
}

// tasksWarmup is how many Sessions run their Task before the baseline
// snapshot (taken settledWait after the last of them): what the
// process keeps whatever the number of Sessions (the engine's and the
// gateway's buffers and pools, the HTTP connections, the scripted model)
// is then in both snapshots, so the delta is what the idle Sessions hold.
const tasksWarmup = 100

func runTasksIdle(ctx context.Context, c *Config, p *progress) (*TasksIdleResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	br, err := startBroker(ctx, filepath.Join(c.root, "tasks-idle-broker"))
	if err != nil {
		return nil, err
	}
	defer br.stop()
	e, err := startEnvOn(ctx, c.root, "tasks-idle", true, br.url, c.Log)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	ref, err := writeAnswerScript(e.home)
	if err != nil {
		return nil, err
	}
	n := c.TaskSessions
	res := &TasksIdleResult{Sessions: n, Wait: idleWait, Warmup: tasksWarmup}
	if res.ConsumersBefore, err = streamConsumers(ctx, e); err != nil {
		return nil, err
	}
	peakCtx, stopPeak := context.WithCancel(ctx)
	peakDone := make(chan struct{})
	go func() {
		defer close(peakDone)
		for peakCtx.Err() == nil {
			if k, err := streamConsumers(peakCtx, e); err == nil {
				res.ConsumersPeak = max(res.ConsumersPeak, k)
			}
			_ = retry.Sleep(peakCtx, 200*time.Millisecond)
		}
	}()
	defer func() { stopPeak(); <-peakDone }()
	p.logf("tasks-idle: %d Sessions of warm-up, one Task each through the engine", tasksWarmup)
	warm, err := runTasks(ctx, e, ref, tasksWarmup)
	if err != nil {
		return nil, err
	}
	if err := retry.Sleep(ctx, time.Until(warm.Add(settledWait))); err != nil {
		return nil, err
	}
	// Each process's memory at one moment: this process's, then the
	// broker child's.
	snapshots := func() (memSnap, memSnap, error) {
		own := snapshot()
		child, err := br.snapshot()
		return own, child, err
	}
	before, brBefore, err := snapshots()
	if err != nil {
		return nil, err
	}
	writeHeap(".before")
	p.logf("tasks-idle: %d Sessions, one Task each through the engine", n)
	t0 := time.Now()
	last, err := runTasks(ctx, e, ref, n)
	if err != nil {
		return nil, err
	}
	res.Run = last.Sub(t0)
	p.logf("tasks-idle: %d Tasks in %v; measuring %v and %v after the last", n, res.Run.Round(time.Millisecond), idleWait, settledWait)
	if err := retry.Sleep(ctx, time.Until(last.Add(idleWait))); err != nil {
		return nil, err
	}
	at10, brAt10, err := snapshots()
	if err != nil {
		return nil, err
	}
	if res.ConsumersAfter, err = streamConsumers(ctx, e); err != nil {
		return nil, err
	}
	if err := retry.Sleep(ctx, time.Until(last.Add(settledWait))); err != nil {
		return nil, err
	}
	after, brAfter, err := snapshots()
	if err != nil {
		return nil, err
	}
	writeHeap("")
	res.MemAtWait, res.BrokerAtWait = deltaPer(before, at10, n), deltaPer(brBefore, brAt10, n)
	res.Mem, res.Broker = deltaPer(before, after, n), deltaPer(brBefore, brAfter, n)
	return res, nil
}

// runTasks creates n Sessions through the API and runs one Task in each
// (8 at a time), and waits until the tracer has written everything. It
// returns when the last Task was seen ended.
func runTasks(ctx context.Context, e *env, ref string, n int) (time.Time, error) {
	err := parallel(ctx, n, 8, func(i int) error {
		s, err := e.api.CreateSession(ctx, client.CreateSession{Model: ref})
		if err != nil {
			return fmt.Errorf("bench: create session: %w", err)
		}
		if _, err := e.api.SubmitTask(ctx, s.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "what is in this folder?"}}}); err != nil {
			return fmt.Errorf("bench: submit task: %w", err)
		}
		return waitFor(ctx, time.Minute, func() bool {
			got, err := e.api.GetSession(ctx, s.ID)
			return err == nil && got.State == omni.StateIdle && got.LastStatus != ""
		})
	})
	if err != nil {
		return time.Time{}, err
	}
	last := time.Now()
	cons, err := e.js.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	if err != nil {
		return time.Time{}, fmt.Errorf("bench: tracer consumer: %w", err)
	}
	if err := waitFor(ctx, 2*time.Minute, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}); err != nil {
		return time.Time{}, fmt.Errorf("bench: waiting for the tracer: %w", err)
	}
	return last, nil
}

// writeHeap writes a heap profile of this moment to $FLOE_BENCH_HEAP (with
// suffix) when that is set (unstable, for debugging: compare the two with
// pprof -diff_base).
func writeHeap(suffix string) {
	if hp := os.Getenv("FLOE_BENCH_HEAP"); hp != "" {
		if f, err := os.Create(hp + suffix); err == nil {
			pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
	}
}
