package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// Every service runs as its own container main (services/<name>/cmd) under
// its own NATS user with the permission sets of deploy/nats/auth.conf, and
// a Session goes through everything that crosses the bus: Session
// records, Task submission, approvals (gateway → engine control), tools
// (jobs, heartbeats, outputs), abort (engine → runner cancel and reply),
// SSE, history, Traces, listing and deletion. The server logs no
// permission violation. Then the users are shown to be fenced: a runner
// cannot submit Tasks or write Session records, the tracer and the gateway
// cannot forge model messages, a hook service's user can do nothing but
// answer, a wrong password is refused.
func TestServicesWorkUnderLeastPrivilegeUsers(t *testing.T) {
	c := newCluster(t, 1, 1)
	c.serviceBin(bins.tracer, nil, "tracer", "tracer")
	c.serviceBin(bins.toolrunner, nil, "toolrunner", "toolrunner")
	engine := c.serviceBin(bins.engine, nil, "engine", "engine")
	port := freePort(t)
	c.serviceBin(bins.gateway, nil, "gateway", "gateway", fmt.Sprintf("FLOE_HTTP_ADDR=127.0.0.1:%d", port))
	gw := client.New(fmt.Sprintf("http://127.0.0.1:%d", port))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{text("Writing notes.", 2, 0),
			map[string]any{"tool_call": map[string]any{"name": "write_file", "id": "w1",
				"arguments": map[string]any{"file_path": "notes.txt", "content": "hello\n"}}}}},
		map[string]any{"steps": []any{execCall("c1", "cat notes.txt")}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
		map[string]any{"steps": []any{execCall("s1", "sleep 20")}},
	}})
	sess, err := gw.CreateSession(ctx, client.CreateSession{Model: ref, Workspace: c.ws, ApprovalMode: omni.ApproveAlwaysAsk})
	if err != nil {
		t.Fatal(err)
	}
	sid := sess.ID
	stream, err := gw.Stream(ctx, sid, "")
	if err != nil {
		t.Fatal(err)
	}
	events := newEventLog(stream)

	// Task 1: every call asks; the test approves through the gateway.
	if _, err := gw.SubmitTask(ctx, sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "write notes"}}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w1", "c1"} {
		events.waitApproval(t, id)
		if err := gw.Approve(ctx, sid, id, "allow"); err != nil {
			t.Fatalf("approve %s: %v", id, err)
		}
	}
	if st := events.waitIdle(t, 1); st != omni.StatusCompleted {
		t.Fatalf("task 1 ended %q", st)
	}

	// Task 2: a running tool is aborted; the runner confirms the cancel.
	if _, err := gw.SubmitTask(ctx, sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "sleep"}}}); err != nil {
		t.Fatal(err)
	}
	hb := c.watchHeartbeats(sid)
	events.waitApproval(t, "s1")
	if err := gw.Approve(ctx, sid, "s1", "allow"); err != nil {
		t.Fatal(err)
	}
	waitBeat(t, hb, "s1")
	// Any toolrunner may publish on floe.hb.*: a runner that does not
	// hold s1's job (it lacks the job's token) is not counted for it.
	c.forgeBeat(sid, "s1")
	engine.waitLog(t, `"runner":"forger"`, 30*time.Second)
	if !strings.Contains(engine.log(), "heartbeat without its job's token ignored") {
		t.Errorf("the engine did not ignore a forged heartbeat:\n%s", engine.tail(10))
	}
	if interrupted, err := gw.Abort(ctx, sid); err != nil || !interrupted {
		t.Fatalf("abort: interrupted %v, %v", interrupted, err)
	}
	if st := events.waitIdle(t, 2); st != omni.StatusAborted {
		t.Fatalf("task 2 ended %q, want aborted", st)
	}

	rs := c.all(sid, nil)
	o := checkSession(t, rs, "write notes", "sleep")
	if got := o.outputs["c1"].msg.Payload.Output; !strings.Contains(got, "hello") {
		t.Errorf("cat output %q", got)
	}
	if len(o.aborted) != 1 || o.aborted[0] != "s1" {
		t.Errorf("calls ended by the abort: %v, want [s1]", o.aborted)
	}
	c.traceEqualsStream(sid)
	if m, err := gw.Messages(ctx, sid); err != nil || len(m.Messages) == 0 {
		t.Errorf("messages: %d, %v", lenOr(m), err)
	}
	if tr, err := gw.Traces(ctx, sid); err != nil || len(tr) != 1 {
		t.Errorf("traces: %v, %v", tr, err)
	}
	if l, err := gw.ListSessions(ctx); err != nil || len(l) != 1 || l[0].State != omni.StateIdle {
		t.Errorf("list: %+v, %v", l, err)
	}
	cancelStream(stream, cancel)
	if err := gw.DeleteSession(context.Background(), sid); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if left := c.all(sid, nil); len(left) != 0 {
		t.Errorf("%d messages left after delete", len(left))
	}
	// The tracer (asked over the bus under its own user) deleted the Trace.
	if files, err := trace.Files(c.home, sid); err != nil || len(files) != 0 {
		t.Errorf("trace files after delete: %v, %v", files, err)
	}
	c.noViolations()

	// The fences.
	c.denied("toolrunner", omni.TaskSubject(sid), omni.TasksStream)
	c.denied("toolrunner", "$KV."+omni.SessionsBucket+"."+sid, "KV_"+omni.SessionsBucket)
	c.denied("tracer", omni.SessionSubject(sid, omni.ClassModel), omni.SessionsStream)
	c.denied("gateway", omni.SessionSubject(sid, omni.ClassModel), omni.SessionsStream)
	c.denied("ops", omni.TaskSubject(sid), omni.TasksStream)
	// A NATS hook service's user answers floe.hook.* and publishes
	// nothing else.
	c.denied("hook", omni.TaskSubject(sid), omni.TasksStream)
	c.denied("hook", omni.SessionSubject(sid, omni.ClassModel), omni.SessionsStream)
	// Deleting a Session purged its messages above, through the tracer:
	// the gateway, which serves HTTP, may not purge the stream itself.
	c.deniedPurge("gateway", omni.SessionsStream)
	if _, err := nats.Connect(c.url(), nats.UserInfo("engine", "wrong")); err == nil {
		t.Error("a wrong password was accepted")
	}
}

// forgeBeat publishes, as the toolrunner user, a heartbeat for call id
// of sid with a token that is not its job's.
func (c *cluster) forgeBeat(sid, id string) {
	c.t.Helper()
	nc, err := nats.Connect(c.url(), nats.UserInfo("toolrunner", c.passwords["toolrunner"]), nats.CustomInboxPrefix("_INBOX.toolrunner"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	b, _ := omni.Pack(&omni.Heartbeat{Runner: "forger", ToolCallIDs: []string{id}, Tokens: []string{"not-the-token"}})
	if err := nc.Publish(omni.HeartbeatSubject(sid), b); err != nil {
		c.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		c.t.Fatal(err)
	}
}

func lenOr(m *client.Messages) int {
	if m == nil {
		return 0
	}
	return len(m.Messages)
}

func cancelStream(s *client.Stream, cancel context.CancelFunc) {
	cancel()
	for range s.C {
	}
}

// connectAs connects as user, with its own inbox prefix. violated(what)
// then waits (5 s at most) for the server to report an error to the
// connection, and checks that it is a permissions violation (what: the
// refused act, for the message).
func (c *cluster) connectAs(user string) (nc *nats.Conn, violated func(what string)) {
	c.t.Helper()
	var mu sync.Mutex
	var asyncErr error
	nc, err := nats.Connect(c.url(), nats.UserInfo(user, c.passwords[user]), nats.CustomInboxPrefix("_INBOX."+user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			asyncErr = err
			mu.Unlock()
		}))
	if err != nil {
		c.t.Fatalf("connect as %s: %v", user, err)
	}
	return nc, func(what string) {
		c.t.Helper()
		eventually(c.t, 5*time.Second, "the permissions violation reported to "+user, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return asyncErr != nil
		})
		mu.Lock()
		defer mu.Unlock()
		if !errors.Is(asyncErr, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(asyncErr.Error()), "permissions violation") {
			c.t.Errorf("%s %s: got %v, want a permissions violation", user, what, asyncErr)
		}
	}
}

// denied connects as user and checks that a JetStream publish on subject
// is refused with a permissions violation and stored nothing in stream.
func (c *cluster) denied(user, subject, stream string) {
	c.t.Helper()
	nc, violated := c.connectAs(user)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.js.Stream(ctx, stream)
	if err != nil {
		c.t.Fatal(err)
	}
	before := st.CachedInfo().State.LastSeq
	js, _ := jetstream.New(nc)
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = js.Publish(pctx, subject, []byte("forged"))
	pcancel()
	if err == nil {
		c.t.Errorf("%s published to %s", user, subject)
	}
	violated("publishing to " + subject)
	info, err := st.Info(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	if info.State.LastSeq != before {
		c.t.Errorf("%s's publish to %s was stored (last seq %d → %d)", user, subject, before, info.State.LastSeq)
	}
}

// deniedPurge connects as user and checks that purging stream is refused
// with a permissions violation and removed nothing.
func (c *cluster) deniedPurge(user, stream string) {
	c.t.Helper()
	nc, violated := c.connectAs(user)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Something to purge: one message of another Session.
	other := omni.SessionSubject("session-2026-12-03-00-00-00-0000beef", omni.ClassServer)
	if _, err := c.js.Publish(ctx, other, []byte(`{"type":"task_state","state":"idle"}`)); err != nil {
		c.t.Fatal(err)
	}
	st, err := c.js.Stream(ctx, stream)
	if err != nil {
		c.t.Fatal(err)
	}
	before := st.CachedInfo().State.Msgs
	if _, err := nc.Request("$JS.API.STREAM.PURGE."+stream, []byte(`{}`), 500*time.Millisecond); err == nil {
		c.t.Errorf("%s's purge of %s was answered", user, stream)
	}
	violated("purging " + stream)
	info, err := st.Info(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	if info.State.Msgs != before || before == 0 {
		c.t.Errorf("%s's purge of %s: %d messages, then %d", user, stream, before, info.State.Msgs)
	}
}

// eventLog collects an SSE stream's events in the background.
type eventLog struct {
	mu     sync.Mutex
	events []client.Event
	cond   chan struct{}
}

func newEventLog(s *client.Stream) *eventLog {
	l := &eventLog{cond: make(chan struct{}, 1)}
	go func() {
		for ev := range s.C {
			l.mu.Lock()
			l.events = append(l.events, ev)
			l.mu.Unlock()
			select {
			case l.cond <- struct{}{}:
			default:
			}
		}
	}()
	return l
}

func (l *eventLog) snapshot() []client.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]client.Event(nil), l.events...)
}

func (l *eventLog) waitFor(t *testing.T, what string, match func([]client.Event) bool) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for !match(l.snapshot()) {
		select {
		case <-l.cond:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("SSE: timed out waiting for %s", what)
		}
	}
}

func serverEvent(ev client.Event) (omni.ServerEvent, bool) {
	var se omni.ServerEvent
	if ev.Event != client.EventServer || json.Unmarshal(ev.Data, &se) != nil {
		return se, false
	}
	return se, true
}

// waitApproval waits for an approval_request of call id.
func (l *eventLog) waitApproval(t *testing.T, id string) {
	t.Helper()
	l.waitFor(t, "approval_request "+id, func(evs []client.Event) bool {
		for _, ev := range evs {
			se, ok := serverEvent(ev)
			if !ok || se.Type != omni.ServerApprovalRequest {
				continue
			}
			m, err := omni.Decode(se.ToolCall)
			if err == nil && m.Payload.ToolCallID == id {
				return true
			}
		}
		return false
	})
}

// waitIdle waits for the n-th task_state idle that follows a running
// state (the snapshot of a fresh connection does not count) and returns
// its status.
func (l *eventLog) waitIdle(t *testing.T, n int) string {
	t.Helper()
	status := ""
	l.waitFor(t, fmt.Sprintf("task %d to end", n), func(evs []client.Event) bool {
		running, ended := false, 0
		for _, ev := range evs {
			se, ok := serverEvent(ev)
			if !ok || se.Type != omni.ServerTaskState || ev.ID == "" {
				continue
			}
			switch se.State {
			case omni.StateRunning:
				running = true
			case omni.StateIdle:
				if running {
					ended++
					running = false
					if ended == n {
						status = se.Status
						return true
					}
				}
			}
		}
		return false
	})
	return status
}

// waitBeat waits for a heartbeat naming call id and returns the runner.
func waitBeat(t *testing.T, hb *heartbeats, id string) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case b := <-hb.ch:
			for _, x := range b.ToolCallIDs {
				if x == id {
					return b.Runner
				}
			}
		case <-deadline:
			t.Fatalf("no heartbeat for %s", id)
		}
	}
}
