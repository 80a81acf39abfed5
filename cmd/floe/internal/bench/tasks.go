package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// TasksIdleResult is what an idle Session costs after a real Task: each
// Session created through the API and given one short Task that the engine
// runs (a scripted model answering with one text), traced, no client
// attached; measured consumersAfter after the last Task ended.
type TasksIdleResult struct {
	Sessions int
	Run      time.Duration // creating the Sessions and running every Task
	Mem      memDelta      // per Session, the whole process
	// ConsumersAfter is the number of consumers on FLOE_SESSIONS left
	// idleWait after the last Task (the tracer's durable is one of them);
	// ConsumersDuring its peak while the Tasks ran.
	ConsumersAfter, ConsumersBefore, ConsumersPeak int
	Wait                                           time.Duration
}

// idleWait is how long after the last Task the figures are taken: past the
// file store's cache expiry, and the "within 10 s".
const idleWait = 10 * time.Second

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

func runTasksIdle(ctx context.Context, c *Config, p *progress) (*TasksIdleResult, error) {
	e, err := startEnv(ctx, c.root, "tasks-idle", true, c.Log)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	ctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	ref, err := writeAnswerScript(e.home)
	if err != nil {
		return nil, err
	}
	n := c.TaskSessions
	time.Sleep(time.Second) // let start-up settle
	res := &TasksIdleResult{Sessions: n, Wait: idleWait}
	if res.ConsumersBefore, err = streamConsumers(ctx, e); err != nil {
		return nil, err
	}
	before := snapshot()
	p.logf("tasks-idle: %d Sessions, one Task each through the engine", n)
	t0 := time.Now()
	peakDone := make(chan struct{})
	go func() {
		defer close(peakDone)
		for ctx.Err() == nil {
			if k, err := streamConsumers(ctx, e); err == nil {
				res.ConsumersPeak = max(res.ConsumersPeak, k)
			}
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}()
	pctx, stopPeak := context.WithCancel(ctx)
	err = parallel(pctx, n, 8, func(i int) error {
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
	stopPeak()
	if err != nil {
		cancel()
		<-peakDone
		return nil, err
	}
	res.Run = time.Since(t0)
	cons, err := e.js.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	if err != nil {
		return nil, fmt.Errorf("bench: tracer consumer: %w", err)
	}
	if err := waitFor(ctx, 2*time.Minute, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}); err != nil {
		return nil, fmt.Errorf("bench: waiting for the tracer: %w", err)
	}
	p.logf("tasks-idle: %d Tasks in %v; measuring %v after the last", n, res.Run.Round(time.Millisecond), idleWait)
	if d := idleWait - time.Since(t0.Add(res.Run)); d > 0 {
		time.Sleep(d)
	}
	after := snapshot()
	// FLOE_BENCH_HEAP (unstable, for debugging): a heap profile of this
	// moment.
	if hp := os.Getenv("FLOE_BENCH_HEAP"); hp != "" {
		if f, err := os.Create(hp); err == nil {
			pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
	}
	res.Mem = deltaPer(before, after, n)
	if res.ConsumersAfter, err = streamConsumers(ctx, e); err != nil {
		return nil, err
	}
	cancel()
	<-peakDone
	return res, nil
}
