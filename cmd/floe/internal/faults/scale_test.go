package faults

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"floe.dev/pkg/omni"
)

// Tool throughput as runners are added: one Task makes 40 parallel
// exec_command calls of `sleep 0.5`, run by 1, 2 and 4 toolrunners of
// concurrency 2 each. The wall times are reported (run with -v), never
// asserted: this machine is shared. Ideal: 10 s, 5 s, 2.5 s.
func TestScaleOutToolThroughput(t *testing.T) {
	const calls, sleep, concurrency = 40, 0.5, 2
	c := newCluster(t, 1, 1)
	c.service("engine", "engine")
	var parallel []any
	for i := range calls {
		parallel = append(parallel, map[string]any{"name": "exec_command", "id": fmt.Sprintf("call_%02d", i),
			"arguments": map[string]any{"description": "sleep", "cmd": fmt.Sprintf("sleep %v", sleep)}})
	}
	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"parallel_tool_calls": parallel}}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}})
	var report []string
	for _, n := range []int{1, 2, 4} {
		var runners []*proc
		for i := range n {
			runners = append(runners, c.service("toolrunner", fmt.Sprintf("toolrunner-%d-of-%d", i+1, n),
				fmt.Sprintf("FLOE_TOOL_CONCURRENCY=%d", concurrency)))
		}
		sid := c.session(ref)
		start := time.Now()
		rs, status := c.wait(sid, c.submit(sid, fmt.Sprintf("%d sleeps", calls)), 3*time.Minute, nil)
		wall := time.Since(start)
		if status != omni.StatusCompleted {
			t.Fatalf("%d runners: task ended %q", n, status)
		}
		o := checkSession(t, rs, fmt.Sprintf("%d sleeps", calls))
		if len(o.outputs) != calls {
			t.Fatalf("%d runners: %d outputs, want %d", n, len(o.outputs), calls)
		}
		// Tool phase: first tool_call to last output, by message timestamps.
		var first, last time.Time
		for _, r := range rs {
			if r.isModel(omni.TypeToolCall) && first.IsZero() {
				first = r.msg.Time()
			}
			if r.isModel(omni.TypeToolCallOutput) {
				last = r.msg.Time()
			}
		}
		line := fmt.Sprintf("runners=%d concurrency=%d calls=%d sleep=%vs: task wall %v, tool phase %v (ideal %v)",
			n, concurrency, calls, sleep, wall.Round(10*time.Millisecond), last.Sub(first).Round(10*time.Millisecond),
			time.Duration(float64(calls)*sleep/float64(n*concurrency)*float64(time.Second)))
		report = append(report, line)
		var wg sync.WaitGroup
		for _, p := range runners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !p.stop(20 * time.Second) {
					t.Errorf("%s did not stop on SIGTERM", p.name)
				}
			}()
		}
		wg.Wait()
	}
	c.noViolations()
	t.Log("scale-out summary:\n" + strings.Join(report, "\n"))
}

// Tool jobs are routed by pool: an engine configured with pool "gpu"
// publishes its Sessions' jobs on floe.tool.gpu.<sid>, so only runners of
// pool "gpu" run them; a runner of the default pool, running beside it,
// gets none.
func TestToolJobsRoutedToNamedPool(t *testing.T) {
	c := newCluster(t, 1, 1)
	gpu := c.service("toolrunner", "toolrunner-gpu", "FLOE_POOL=gpu")
	c.service("toolrunner", "toolrunner-default")
	c.service("engine", "engine-gpu", "FLOE_POOL=gpu")
	var parallel []any
	for i := range 6 {
		parallel = append(parallel, map[string]any{"name": "exec_command", "id": fmt.Sprintf("call_%d", i),
			"arguments": map[string]any{"description": "where", "cmd": logCmd + "; sleep 0.2"}})
	}
	sid := c.session(c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"parallel_tool_calls": parallel}}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}}))
	hb := c.watchHeartbeats(sid)
	rs, status := c.wait(sid, c.submit(sid, "use the gpu"), 90*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q", status)
	}
	o := checkSession(t, rs, "use the gpu")
	if len(o.outputs) != 6 {
		t.Fatalf("%d outputs, want 6", len(o.outputs))
	}
	for _, id := range o.calls {
		if n := c.executions(sid, id); n != 1 {
			t.Errorf("%s ran %d times", id, n)
		}
	}
	// Every heartbeat came from the gpu runner.
	beats := 0
	for drained := false; !drained; {
		select {
		case b := <-hb.ch:
			beats++
			if runnerPid(b.Runner) != gpu.pid() {
				t.Errorf("heartbeat from runner %s, not the gpu runner (pid %d)", b.Runner, gpu.pid())
			}
		default:
			drained = true
		}
	}
	if beats == 0 {
		t.Error("no heartbeats seen")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	delivered := func(name string) uint64 {
		cons, err := c.js.Consumer(ctx, omni.ToolsStream, name)
		if err != nil {
			t.Fatalf("consumer %s: %v", name, err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.Delivered.Consumer
	}
	if n := delivered("floe-toolrunner-gpu"); n != 6 {
		t.Errorf("gpu pool delivered %d jobs, want 6", n)
	}
	if n := delivered("floe-toolrunner-default"); n != 0 {
		t.Errorf("default pool delivered %d jobs, want 0", n)
	}
	c.noViolations()
}
