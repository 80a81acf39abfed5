package faults

import (
	"fmt"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
)

// The tracer is killed (SIGKILL) in the middle of a Session while records
// flow, and restarted on the same home: the Trace ends up equal to the
// stream, nothing lost and nothing written twice, and the Session is
// unaffected.
func TestTracerKilledMidSession(t *testing.T) {
	c := newCluster(t, 1, 1)
	tr := c.service("tracer", "tracer-1")
	c.service("toolrunner", "toolrunner")
	c.service("engine", "engine")

	var reqs []any
	for i := range 6 {
		reqs = append(reqs, map[string]any{"steps": []any{
			text(fmt.Sprintf("Step %d: a few words streamed one by one.", i), 8, 40),
			execCall(fmt.Sprintf("call_%d", i), fmt.Sprintf("sleep 0.2; echo step %d", i)),
		}})
	}
	reqs = append(reqs, map[string]any{"steps": []any{text("Done.", 1, 0)}})
	sid := c.session(c.script(map[string]any{"requests": reqs}))
	task := c.submit(sid, "six steps")

	// Kill the tracer once it has written part of the Session.
	eventually(t, 60*time.Second, "the tracer to write the first steps", func() bool {
		p, ok, err := trace.ReadPos(c.home, sid)
		return err == nil && ok && p.Seq > 0 && c.outputsSoFar(sid) >= 2
	})
	tr.kill(t)
	time.Sleep(500 * time.Millisecond) // records keep flowing while it is down
	c.service("tracer", "tracer-2")

	rs, status := c.wait(sid, task, 90*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q; last: %v", status, lastLabels(rs, 10))
	}
	o := checkSession(t, rs, "six steps")
	if len(o.calls) != 6 {
		t.Errorf("%d calls, want 6", len(o.calls))
	}
	c.checkIdle(sid, omni.StatusCompleted)
	c.traceEqualsStream(sid)
	c.noViolations()
}

// outputsSoFar counts the complete tool outputs stored for a Session.
func (c *cluster) outputsSoFar(sid string) int {
	n := 0
	for _, r := range c.all(sid, []string{omni.ClassModel}) {
		if r.isModel(omni.TypeToolCallOutput) {
			n++
		}
	}
	return n
}
