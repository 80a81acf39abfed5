package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
)

// A three-node JetStream cluster with every stream and the bucket
// replicated three times (floe setup with FLOE_REPLICAS=3): stopping the
// node that leads FLOE_SESSIONS in the middle of a Session does not stop
// it. The running Task completes, every tool call runs exactly once and has
// exactly one output, nothing is published twice, the Trace equals the
// stream, the Session ends idle, and a new Session runs to completion on
// the two remaining nodes. (That the stream also keeps each producer's
// order is TestNATSLeaderFailoverKeepsProducerOrder.)
func TestNATSNodeStoppedSessionsKeepRunning(t *testing.T) {
	rs, rs2 := natsNodeStopped(t)
	for _, x := range []struct {
		rs     []rec
		prompt string
		calls  int
	}{{rs, "eight steps", 8}, {rs2, "after the stop", 2}} {
		calls, problems := pairsByID(x.rs, x.prompt)
		for _, p := range problems {
			t.Error(p)
		}
		// A failed attempt takes its (never run) call with it.
		failed := 0
		for _, r := range x.rs {
			if r.isEvent(omni.TypeRequestEnd) && r.msg.Payload.Status != omni.StatusCompleted {
				failed++
			}
		}
		if calls < x.calls-failed || calls > x.calls {
			t.Errorf("%q: %d calls with %d failed attempts, want %d less at most the failed ones", x.prompt, calls, failed, x.calls)
		}
	}
}

// The same failure, checked strictly, with many producers at once: 10
// Sessions stream model partials and tool output partials when the node
// leading FLOE_SESSIONS is stopped (SIGTERM) or killed (kill -9). Every
// Session's stream keeps each producer's order with no gap inside any
// segment (start → deltas → stop → complete, the deltas concatenating to
// the complete message; a failed attempt's segments are closed with what
// the stream holds), requests alternate, pairing holds, every tool call ran
// once and the Trace equals the stream. scripts/failover-loop runs a
// variant many times.
func TestNATSLeaderFailoverKeepsProducerOrder(t *testing.T) {
	for _, v := range []struct {
		name string
		kill bool
	}{{"stop", false}, {"kill9", true}} {
		t.Run(v.name, func(t *testing.T) { leaderFailover(t, 10, v.kill) })
	}
}

func leaderFailover(t *testing.T, sessions int, kill bool) {
	c := newCluster(t, 3, 3)
	c.service("tracer", "tracer")
	c.service("toolrunner", "toolrunner-1")
	c.service("toolrunner", "toolrunner-2")
	c.service("engine", "engine-1")
	c.service("engine", "engine-2")

	// Each request streams text while its call streams lines of output.
	const steps = 4
	stream := `; for i in $(seq 1 25); do echo "line $i of output"; sleep 0.03; done; echo "$FLOE_SESSION_ID $FLOE_TOOL_CALL_ID done" >> calls.log`
	type run struct {
		i                 int
		sid, task, prompt string
	}
	var runs []run
	for s := range sessions {
		var reqs []any
		for i := range steps {
			id := fmt.Sprintf("s%d_%d", s, i)
			reqs = append(reqs, map[string]any{"steps": []any{
				text(fmt.Sprintf("Session %d, step %d: streaming a few words at a time.", s, i), 30, 25),
				execCall(id, logCmd+stream),
			}})
		}
		reqs = append(reqs, map[string]any{"steps": []any{text("Done.", 3, 10)}})
		sid := c.session(c.script(map[string]any{"requests": reqs}))
		prompt := fmt.Sprintf("session %d", s)
		runs = append(runs, run{s, sid, c.submit(sid, prompt), prompt})
	}
	// The fault comes once every Session runs its first tool and half of
	// them have finished it: tool output partials and the next request's
	// model partials are in flight. (calls.log: one file read a poll, so
	// the trigger does not lag behind the Sessions.)
	eventually(t, 90*time.Second, "every Session running its first tool, half done with it", func() bool {
		done := 0
		for _, r := range runs {
			id := fmt.Sprintf("s%d_0", r.i)
			if c.executions(r.sid, id) < 1 {
				return false
			}
			done += c.executions(r.sid, id+" done")
		}
		return done >= sessions/2
	})

	leader := c.sessionsLeader()
	running := 0
	for _, r := range runs {
		if rec := c.record(r.sid); rec.State != omni.StateIdle {
			running++
		}
	}
	if running == 0 {
		t.Fatalf("every Session finished before the fault: the failover hit nothing")
	}
	stoppedAt := time.Now()
	if kill {
		leader.proc.kill(t)
	} else if !leader.proc.stop(20 * time.Second) {
		t.Logf("node %s needed SIGKILL", leader.name)
	}
	t.Logf("%s %s, the FLOE_SESSIONS leader, while %d of %d Sessions streamed", map[bool]string{false: "stopped", true: "killed"}[kill], leader.name, running, sessions)

	for _, r := range runs {
		// Wait on the Session record, then read the stream afresh: a
		// consumer this test created while the cluster re-elected may
		// stay silent (the engines' own reads recover).
		eventually(t, 180*time.Second, r.sid+" idle", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			rec, _, err := c.sessions.Get(ctx, r.sid)
			return err == nil && rec.State == omni.StateIdle && rec.TaskID == ""
		})
	}
	idleAfter := time.Since(stoppedAt)
	var sids []string
	for _, r := range runs {
		sids = append(sids, r.sid)
	}
	c.tracerCaughtUp(sids...)
	t.Logf("every Session idle %v after the %s, every Trace written %v after it",
		idleAfter.Round(100*time.Millisecond), map[bool]string{false: "stop", true: "kill"}[kill], time.Since(stoppedAt).Round(100*time.Millisecond))

	failedAttempts, lostCalls := 0, 0
	for _, r := range runs {
		rs := c.all(r.sid, nil)
		status := ""
		for _, x := range rs {
			if x.class == omni.ClassServer && x.ev.Type == omni.ServerTaskState && x.ev.State == omni.StateIdle && x.ev.TaskID == r.task {
				status = x.ev.Status
			}
		}
		if status != omni.StatusCompleted {
			t.Fatalf("%s: task ended %q; last: %v", r.sid, status, lastLabels(rs, 12))
		}
		if dir := os.Getenv("FAULTS_DUMP"); dir != "" {
			// Debugging aid: every Session's stream, one line a message.
			var b strings.Builder
			for _, x := range rs {
				fmt.Fprintf(&b, "%d %s %s %q\n", x.seq, x.class, label(x), x.msg.Payload.Content())
			}
			if err := os.MkdirAll(dir, 0o755); err == nil {
				_ = os.WriteFile(filepath.Join(dir, r.sid+".txt"), []byte(b.String()), 0o644)
			}
		}
		o := checkSession(t, rs, r.prompt)
		if o.dangling != 0 {
			t.Errorf("%s: %d segments left open; no producer died, so none may be", r.sid, o.dangling)
		}
		for _, x := range rs {
			if x.isEvent(omni.TypeRequestEnd) && x.msg.Payload.Status != omni.StatusCompleted {
				failedAttempts++
			}
		}
		_, problems := pairsByID(rs, r.prompt)
		for _, p := range problems {
			t.Errorf("%s: %s", r.sid, p)
		}
		// A call on the stream ran exactly once; a call whose message a
		// failed attempt lost never ran (the scripted model's retry goes
		// on with its next request).
		onStream := map[string]bool{}
		for _, id := range o.calls {
			onStream[id] = true
		}
		for i := range steps {
			id := fmt.Sprintf("s%d_%d", r.i, i)
			want := 0
			if onStream[id] {
				want = 1
			}
			if n := c.executions(r.sid, id); n != want {
				t.Errorf("%s: call %s ran %d times, want %d (on the stream: %v)", r.sid, id, n, want, onStream[id])
			}
		}
		lostCalls += steps - len(o.calls)
		c.checkIdle(r.sid, omni.StatusCompleted)
		c.traceEqualsStream(r.sid)
	}
	t.Logf("all %d Sessions completed %v after the %s; %d request attempts failed and were retried, %d tool calls were lost with them (never ran)",
		sessions, time.Since(stoppedAt).Round(100*time.Millisecond), map[bool]string{false: "stop", true: "kill"}[kill], failedAttempts, lostCalls)
	c.noViolations()
}

// natsNodeStopped runs a Session of eight tool steps on a 3-node R3
// cluster with two engines and two runners, stops the node leading
// FLOE_SESSIONS after the second step, waits for the Task, then runs a
// second Session. It checks liveness, executions, the end state and the
// Trace, and returns both streams.
func natsNodeStopped(t *testing.T) (running, after []rec) {
	c := newCluster(t, 3, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range []string{omni.SessionsStream, omni.TasksStream, omni.ToolsStream, "KV_" + omni.SessionsBucket} {
		st, err := c.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Fatalf("%s has %d replicas, want 3", name, r)
		}
	}
	c.service("tracer", "tracer")
	c.service("toolrunner", "toolrunner-1")
	c.service("toolrunner", "toolrunner-2")
	c.service("engine", "engine-1")
	c.service("engine", "engine-2")

	steps := func(prefix string, n int) string {
		var reqs []any
		for i := range n {
			id := fmt.Sprintf("%s_%d", prefix, i)
			reqs = append(reqs, map[string]any{"steps": []any{
				text(fmt.Sprintf("Step %d.", i), 4, 50),
				execCall(id, logCmd+"; sleep 0.3"),
			}})
		}
		reqs = append(reqs, map[string]any{"steps": []any{text("Done.", 1, 0)}})
		return c.script(map[string]any{"requests": reqs})
	}
	sid := c.session(steps("a", 8))
	task := c.submit(sid, "eight steps")
	eventually(t, 60*time.Second, "two steps done", func() bool { return c.outputsSoFar(sid) >= 2 })

	leader := c.sessionsLeader()
	stoppedAt := time.Now()
	if !leader.proc.stop(20 * time.Second) {
		t.Logf("node %s needed SIGKILL", leader.name)
	}
	t.Logf("stopped %s, the FLOE_SESSIONS leader, after %d outputs", leader.name, c.outputsSoFar(sid))

	rs, status := c.wait(sid, task, 120*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q; last: %v", status, lastLabels(rs, 12))
	}
	// Report (not assert) how long the Session paused: consumers that
	// lived on the stopped node are re-created once their missed
	// heartbeats are noticed.
	var prev time.Time
	var pause time.Duration
	for _, r := range rs {
		if r.class == omni.ClassServer {
			continue
		}
		ts := r.msg.Time()
		if ts.After(stoppedAt) && !prev.IsZero() && ts.Sub(prev) > pause {
			pause = ts.Sub(prev)
		}
		prev = ts
	}
	t.Logf("the running Task completed %v after the stop; longest pause between its messages %v",
		time.Since(stoppedAt).Round(100*time.Millisecond), pause.Round(10*time.Millisecond))
	// A call on the stream ran exactly once; a call whose message a failed
	// attempt lost never ran (the scripted model's retry goes on with its
	// next request).
	onStream := map[string]bool{}
	for _, r := range rs {
		if r.isModel(omni.TypeToolCall) && r.msg.Payload.Stop() == omni.StatusCompleted {
			onStream[r.msg.Payload.ToolCallID] = true
		}
	}
	for _, id := range []string{"a_0", "a_1", "a_2", "a_3", "a_4", "a_5", "a_6", "a_7"} {
		want := 0
		if onStream[id] {
			want = 1
		}
		if n := c.executions(sid, id); n != want {
			t.Errorf("%s ran %d times, want %d (on the stream: %v)", id, n, want, onStream[id])
		}
	}
	c.checkIdle(sid, omni.StatusCompleted)
	c.traceEqualsStream(sid)

	// A new Session on the two remaining nodes.
	sid2 := c.session(steps("b", 2))
	rs2, status2 := c.wait(sid2, c.submit(sid2, "after the stop"), 90*time.Second, nil)
	if status2 != omni.StatusCompleted {
		t.Fatalf("new task ended %q; last: %v", status2, lastLabels(rs2, 12))
	}
	c.checkIdle(sid2, omni.StatusCompleted)
	c.traceEqualsStream(sid2)
	c.noViolations()
	return rs, rs2
}

// pairsByID checks a Session's complete messages regardless of their
// order: one session_meta, the prompt once, every tool_call id once with
// exactly one approval_decision and exactly one output, no output or
// decision for an unknown call, and a last server event task_state idle.
// It returns the number of calls and the problems found.
func pairsByID(rs []rec, prompt string) (int, []string) {
	var problems []string
	metas, prompts := 0, 0
	calls, outputs, decisions := map[string]int{}, map[string]int{}, map[string]int{}
	var lastServer *rec
	for i, r := range rs {
		if r.class == omni.ClassServer {
			lastServer = &rs[i]
			continue
		}
		p := r.msg.Payload
		switch {
		case r.msg.Type == omni.KindSessionMeta:
			metas++
		case r.isModel(omni.TypeText) && p.Role == omni.RoleUser && p.Text == prompt:
			prompts++
		case r.isModel(omni.TypeToolCall):
			calls[p.ToolCallID]++
		case r.isModel(omni.TypeToolCallOutput):
			outputs[p.ToolCallID]++
		case r.isEvent(omni.TypeApprovalDecision):
			decisions[p.ToolCallID]++
		}
	}
	if metas != 1 || prompts != 1 {
		problems = append(problems, fmt.Sprintf("%d session_meta and %d prompts %q, want one each", metas, prompts, prompt))
	}
	for id, n := range calls {
		if n != 1 || outputs[id] != 1 || decisions[id] != 1 {
			problems = append(problems, fmt.Sprintf("call %s: %d tool_calls, %d outputs, %d approval_decisions; want one each", id, n, outputs[id], decisions[id]))
		}
	}
	for id := range outputs {
		if calls[id] == 0 {
			problems = append(problems, "output for unknown call "+id)
		}
	}
	for id := range decisions {
		if calls[id] == 0 {
			problems = append(problems, "approval_decision for unknown call "+id)
		}
	}
	if lastServer == nil || lastServer.ev.Type != omni.ServerTaskState || lastServer.ev.State != omni.StateIdle {
		problems = append(problems, "the last server event is not task_state idle")
	}
	return len(calls), problems
}

// sessionsLeader returns the node leading FLOE_SESSIONS.
func (c *cluster) sessionsLeader() *node {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		c.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil || info.Cluster == nil {
		c.t.Fatalf("stream info: %v", err)
	}
	for _, nd := range c.nodes {
		if nd.name == info.Cluster.Leader {
			return nd
		}
	}
	c.t.Fatalf("leader %q is none of the nodes", info.Cluster.Leader)
	return nil
}
