package faults

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/procfs"
)

// A toolrunner killed (SIGKILL) in the middle of a tool: the engine gives
// that call exactly one failed output, saying the outcome is unknown, once
// its heartbeats have been missing for the heartbeat timeout; the tool is
// not run again anywhere; the Task goes on (its next call runs on the
// other runner) and completes; the Trace equals the stream.
func TestToolrunnerKilledMidTool(t *testing.T) {
	const hbTimeout = 3 * time.Second
	c := newCluster(t, 1, 1)
	mark := fmt.Sprintf("1000.%d31", os.Getpid())
	daemon := fmt.Sprintf("(setsid nohup sleep %s >/dev/null 2>&1 &)", mark)
	c.service("tracer", "tracer")
	runners := map[int]*proc{}
	for _, name := range []string{"toolrunner-1", "toolrunner-2"} {
		p := c.service("toolrunner", name)
		runners[p.pid()] = p
	}
	c.service("engine", "engine", fmt.Sprintf("FLOE_HEARTBEAT_TIMEOUT_MS=%d", hbTimeout.Milliseconds()))

	ref := c.script(map[string]any{"requests": []any{
		// It daemonizes a sleep first (setsid nohup, its parent gone):
		// that one must die with the runner too.
		map[string]any{"steps": []any{text("Starting the long job.", 2, 0), execCall("call_long", daemon+"; "+logCmd+"; sleep 20")}},
		map[string]any{"steps": []any{text("It was lost; one more step.", 2, 0), execCall("call_next", logCmd+"; echo after")}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}})
	sid := c.session(ref)
	hb := c.watchHeartbeats(sid)
	task := c.submit(sid, "run the long job")

	runner := waitBeat(t, hb, "call_long")
	victim := runners[runnerPid(runner)]
	if victim == nil {
		t.Fatalf("heartbeat from unknown runner %q", runner)
	}
	// The command has logged its execution before it sleeps.
	eventually(t, 20*time.Second, "call_long to start its command", func() bool { return c.executions(sid, "call_long") == 1 })
	// Its tool is confined (protocol.md §7): its processes die with the runner,
	// through the PID namespace, so nothing writes side effects after the
	// call was reported lost. Should one survive, end it with the test.
	tree := procfs.Descendants(victim.pid())
	for _, pid := range tree {
		t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	}
	daemons := procfs.WithArgs("sleep", mark)
	if len(daemons) != 1 || !slices.Contains(tree, daemons[0]) {
		t.Fatalf("the daemonized sleep: pids %v, want one in the runner's tree %v", daemons, tree)
	}
	victim.kill(t)
	killedAt := time.Now()
	eventually(t, 2*time.Second, "the killed runner's tool processes to end", func() bool {
		for _, pid := range tree {
			if procfs.Alive(pid) {
				return false
			}
		}
		return true
	})
	if pids := procfs.WithArgs("sleep", mark); len(pids) != 0 {
		t.Errorf("the daemonized sleep %v outlived its runner", pids)
	}

	rs, status := c.wait(sid, task, 90*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q, want completed; last: %v", status, lastLabels(rs, 10))
	}
	o := checkSession(t, rs, "run the long job")
	lost := o.outputs["call_long"]
	p := lost.msg.Payload
	if p.StopReason != omni.StatusFailed || !strings.Contains(p.Output, "outcome is unknown") || !strings.Contains(p.Output, "not re-run") {
		t.Errorf("lost call's output = %q (stop_reason %q), want a failed output saying the outcome is unknown", p.Output, p.StopReason)
	}
	t.Logf("lost-runner output %v after the kill (heartbeat timeout %v)", lost.msg.Time().Sub(killedAt).Round(10*time.Millisecond), hbTimeout)
	if n := c.executions(sid, "call_long"); n != 1 {
		t.Errorf("call_long ran %d times, want once (never re-run)", n)
	}
	if n := c.executions(sid, "call_next"); n != 1 {
		t.Errorf("call_next ran %d times, want once", n)
	}
	if got := o.outputs["call_next"].msg.Payload; got.StopReason != omni.StatusCompleted || !strings.Contains(got.Output, "after") {
		t.Errorf("call_next output %q (stop_reason %q)", got.Output, got.StopReason)
	}
	c.checkIdle(sid, omni.StatusCompleted)
	c.traceEqualsStream(sid)
	c.noViolations()
}
