package task

import (
	"cmp"
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
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/scripted"
	"floe.dev/services/engine/internal/snapshot"
)

// harness drives Runners directly against a real embedded nats-server:
// the Session record is created as the gateway does, a Task is begun and
// run by task.Runner, tool jobs are served by a small fake runner that
// speaks the toolrunner's bus protocol (job from FLOE_TOOLS, heartbeats,
// complete output with the output Msg-Id, cancel request/reply).
type harness struct {
	t    *testing.T
	env  *bustest.Env
	deps *Deps
	prov *scripted.Provider
}

func newHarness(t *testing.T, script string, tune func(*Settings)) *harness {
	t.Helper()
	env := bustest.Start(t, bus.Config{})
	prov, err := scripted.Parse("test", []byte(script))
	if err != nil {
		t.Fatalf("script: %v", err)
	}
	s := Settings{
		Pool:             omni.DefaultPool,
		RetryBase:        20 * time.Millisecond,
		RetryCap:         80 * time.Millisecond,
		RetryMax:         3,
		HeartbeatTimeout: 5 * time.Second,
		CancelWait:       3 * time.Second,
		ToolListTimeout:  5 * time.Second,
		MaxSubagentDepth: 0,
		AckWait:          30 * time.Second,
	}
	if tune != nil {
		tune(&s)
	}
	d := &Deps{
		NC:       env.Conn,
		JS:       env.JS,
		Sessions: env.Sessions,
		Log:      zerolog.Nop(),
		Settings: s,
		Resolve: func(ref string) (model.Provider, model.Info, error) {
			if ref != "scripted:test" {
				return nil, model.Info{}, fmt.Errorf("unknown model %q", ref)
			}
			return prov, prov.Info(), nil
		},
		Tools: func(context.Context) (omni.ToolList, error) {
			return omni.ToolList{Tools: []omni.ToolSpec{{
				Name: "exec_command", Description: "run a command",
				Parameters: json.RawMessage(`{"type":"object"}`), Permission: "rw", Source: "builtin",
			}, {
				Name: "read_file", Description: "read a file",
				Parameters: json.RawMessage(`{"type":"object"}`), Permission: "r", Source: "builtin",
			}}}, nil
		},
	}
	// As an engine runs them: each Task starts from the context snapshot
	// of the one before (TestSnapshotsNeverChangeTheModelRequests also
	// runs a Session without).
	d.Snapshots = snapshot.Open(context.Background(), env.JS, s.Home, zerolog.Nop())
	return &harness{t: t, env: env, deps: d, prov: prov}
}

// session creates an idle Session record.
func (h *harness) session(sid, mode string) { h.sessionWith(sid, mode, nil) }

// sessionWith creates an idle Session record that edit adjusts first.
func (h *harness) sessionWith(sid, mode string, edit func(*omni.SessionRecord)) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec := &omni.SessionRecord{ID: sid, Model: "scripted:test", Workspace: h.t.TempDir(),
		ApprovalMode: mode, State: omni.StateIdle, CreatedUnixMs: time.Now().UnixMilli()}
	if edit != nil {
		edit(rec)
	}
	if err := h.env.Sessions.Create(ctx, rec); err != nil {
		h.t.Fatalf("create session: %v", err)
	}
}

type result struct {
	status string
	err    error
}

// run begins a Task with the user text and runs it on its own goroutine.
func (h *harness) run(sid, taskID, text string) <-chan result {
	h.t.Helper()
	_, done := h.start(sid, taskID, text)
	return done
}

// start is run that also returns the Runner.
func (h *harness) start(sid, taskID, text string) (*Runner, <-chan result) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	h.t.Cleanup(cancel)
	if _, err := h.env.Sessions.Begin(ctx, sid, omni.StateRunning, taskID); err != nil {
		h.t.Fatalf("begin: %v", err)
	}
	t := omni.Task{ID: taskID, Kind: omni.TaskRun, SessionID: sid,
		Input: []omni.InputPart{{Type: "text", Text: text}}}
	return h.runTask(ctx, t)
}

// runTask runs a Runner for t (already begun) on its own goroutine: an
// engine taking over a redelivered Task runs it again this way.
func (h *harness) runTask(ctx context.Context, t omni.Task) (*Runner, <-chan result) {
	r := New(h.deps, t)
	done := make(chan result, 1)
	go func() {
		st, err := r.Run(ctx)
		done <- result{st, err}
	}()
	return r, done
}

func (h *harness) wait(done <-chan result) string {
	h.t.Helper()
	res := h.waitResult(done)
	if res.err != nil {
		h.t.Fatalf("run: %v", res.err)
	}
	return res.status
}

// waitResult waits for the Run's outcome, error included.
func (h *harness) waitResult(done <-chan result) result {
	h.t.Helper()
	select {
	case res := <-done:
		return res
	case <-time.After(30 * time.Second):
		h.t.Fatal("task did not finish")
		return result{}
	}
}

// complete runs a Task to the end and fails the test unless it completed
// and the model saw what the script expects.
func (h *harness) complete(sid, taskID, text string) {
	h.t.Helper()
	if st := h.wait(h.run(sid, taskID, text)); st != Completed {
		h.t.Fatalf("%s status %q%s", taskID, st, dump(h.messages(sid)))
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		h.t.Fatalf("model saw: %v", errs)
	}
}

// compactingSession creates an allow-all Session that compacts
// (summarize) after every turn.
func (h *harness) compactingSession(sid string) {
	h.t.Helper()
	h.sessionWith(sid, omni.ApproveAllowAll, func(r *omni.SessionRecord) {
		r.Compaction = omni.CompactionConfig{MaxSessionTurns: 1, Mode: omni.ModeSummarize}
	})
}

// abort asks the Task running on sid to abort, waits until it returns
// aborted, and reads the stream.
func (h *harness) abort(sid string, done <-chan result) []omni.Message {
	h.t.Helper()
	if rep, err := h.control(sid, omni.CtlAbort, omni.Control{}); err != nil || !rep.OK {
		h.t.Fatalf("abort: %+v %v", rep, err)
	}
	if st := h.wait(done); st != Aborted {
		h.t.Fatalf("status %q, want aborted", st)
	}
	return h.messages(sid)
}

// update changes the Session record as the gateway (or another engine)
// would.
func (h *harness) update(sid string, edit func(*omni.SessionRecord)) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.env.Sessions.Update(ctx, sid, func(r *omni.SessionRecord) error { edit(r); return nil }); err != nil {
		h.t.Fatalf("update session: %v", err)
	}
}

// record reads the Session record.
func (h *harness) record(sid string) *omni.SessionRecord {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, _, err := h.env.Sessions.Get(ctx, sid)
	if err != nil {
		h.t.Fatalf("get session: %v", err)
	}
	return rec
}

// messages reads the Session's stream in order (server events skipped).
func (h *harness) messages(sid string) []omni.Message { return h.classMessages(sid, nil) }

// control sends one control request to the Task's engine.
func (h *harness) control(sid, verb string, c omni.Control) (omni.ControlReply, error) {
	body, _ := omni.Pack(&c)
	m, err := h.env.Conn.Request(omni.ControlSubject(sid, verb), body, 5*time.Second)
	if err != nil {
		return omni.ControlReply{}, err
	}
	var rep omni.ControlReply
	return rep, omni.Unpack(m.Data, &rep)
}

// pending returns the tool call ids of the pending approval requests.
func (h *harness) pending(sid string) []string {
	rep, err := h.control(sid, omni.CtlPending, omni.Control{})
	if err != nil || !rep.OK {
		return nil
	}
	var ids []string
	for _, ev := range rep.Pending {
		var se omni.ServerEvent
		if json.Unmarshal(ev, &se) != nil {
			continue
		}
		m, err := omni.Decode(se.ToolCall)
		if err == nil {
			ids = append(ids, m.Payload.ToolCallID)
		}
	}
	return ids
}

// fakeRunner serves the pool's tool jobs for one Session (every Session
// when sid is "") as the toolrunner
// does on the bus. behave decides per job: nil output means "run until
// cancelled or finished" (heartbeats keep going; a cancel publishes the
// interrupted output, then confirms; finish publishes an output), silent
// means "take the job, beat once, then nothing" (a runner that died).
type fakeRunner struct {
	noBeat bool // set before any job: acks jobs, never beats nor runs them
	h      *harness
	sid    string
	behave func(job omni.ToolJob) *omni.Message
	js     jetstream.JetStream

	mu      sync.Mutex
	jobs    []string
	jobIDs  []string // each job's Nats-Msg-Id
	running map[string]chan struct{}
}

// silent is the behaviour of a runner that dies after taking the job.
var silent = &omni.Message{}

// finish ends a running job with out, as the runner does when the tool
// returns: its heartbeats stop, then the output is published.
func (f *fakeRunner) finish(sid string, out *omni.Message) {
	f.mu.Lock()
	ch := f.running[out.Payload.ToolCallID]
	delete(f.running, out.Payload.ToolCallID)
	f.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	f.publish(f.js, sid, out)
}

func (h *harness) runner(sid string, behave func(omni.ToolJob) *omni.Message) *fakeRunner {
	h.t.Helper()
	return h.startRunner(&fakeRunner{h: h, sid: sid, behave: behave, running: map[string]chan struct{}{}})
}

// runnerNoBeat starts a runner that acks its jobs and never runs them.
func (h *harness) runnerNoBeat(sid string) *fakeRunner {
	h.t.Helper()
	return h.startRunner(&fakeRunner{noBeat: true, h: h, sid: sid, running: map[string]chan struct{}{}})
}

func (h *harness) startRunner(f *fakeRunner) *fakeRunner {
	h.t.Helper()
	sid := f.sid
	nc := bustest.Connect(h.t, h.env.Server)
	js, err := jetstream.New(nc)
	if err != nil {
		h.t.Fatal(err)
	}
	f.js = js
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.CreateOrUpdateConsumer(ctx, omni.ToolsStream, jetstream.ConsumerConfig{
		Durable: "fake-" + cmp.Or(sid, "all"), FilterSubject: omni.ToolSubject(omni.DefaultPool, cmp.Or(sid, "*")),
		AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		h.t.Fatalf("tool consumer: %v", err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	sub, err := nc.Subscribe(omni.CancelSubject(cmp.Or(sid, "*")), func(m *nats.Msg) {
		msid := strings.TrimPrefix(m.Subject, omni.CancelSubject(""))
		var c omni.Cancel
		_ = omni.Unpack(m.Data, &c)
		var stopped []string
		for _, id := range c.ToolCallIDs {
			f.mu.Lock()
			ch := f.running[id]
			delete(f.running, id)
			f.mu.Unlock()
			if ch == nil {
				continue
			}
			close(ch)
			out := omni.ToolCallOutput(id, omni.InterruptedOutput, omni.StatusAborted)
			f.publish(js, msid, &out)
			stopped = append(stopped, id)
		}
		if len(stopped) > 0 {
			b, _ := omni.Pack(&omni.CancelReply{Runner: "fake", ToolCallIDs: stopped})
			_ = m.Respond(b)
		}
	})
	if err != nil {
		h.t.Fatal(err)
	}
	// A live runner answers the pool's tool list requests (the engine asks
	// before failing a queued job as not started).
	listSub := answerToolList(h.t, nc)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		var job omni.ToolJob
		if err := omni.Unpack(msg.Data(), &job); err != nil {
			_ = msg.Term()
			return
		}
		_ = msg.Ack()
		f.mu.Lock()
		f.jobs = append(f.jobs, job.ToolCallID)
		f.jobIDs = append(f.jobIDs, msg.Headers().Get(jetstream.MsgIDHeader))
		f.mu.Unlock()
		if f.noBeat {
			return // took the job and never ran it (its ack failed on its side)
		}
		f.beat(nc, job)
		out := f.behave(job)
		if out == silent {
			return
		}
		if out != nil {
			f.publish(js, job.SessionID, out)
			return
		}
		ch := make(chan struct{})
		f.mu.Lock()
		f.running[job.ToolCallID] = ch
		f.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ch:
					return
				case <-stop:
					return
				case <-tick.C:
					f.beat(nc, job)
				}
			}
		}()
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		cc.Stop()
		_ = sub.Unsubscribe()
		_ = listSub.Unsubscribe()
		close(stop)
		wg.Wait()
	})
	return f
}

// answerToolList answers the default pool's tool list requests as a
// runner with no tools.
func answerToolList(t testing.TB, nc *nats.Conn) *nats.Subscription {
	t.Helper()
	sub, err := nc.QueueSubscribe(omni.ToolListSubject(omni.DefaultPool), "fake-runners", func(m *nats.Msg) {
		b, _ := omni.Pack(&omni.ToolList{Runner: "fake"})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// beat reports a job running, with its token as a runner does.
func (f *fakeRunner) beat(nc *nats.Conn, job omni.ToolJob) {
	sid, id := job.SessionID, job.ToolCallID
	b, _ := omni.Pack(&omni.Heartbeat{Runner: "fake", ToolCallIDs: []string{id}, Tokens: []string{job.BeatToken}})
	_ = nc.Publish(omni.HeartbeatSubject(sid), b)
}

func (f *fakeRunner) publish(js jetstream.JetStream, sid string, out *omni.Message) {
	nm, err := bus.SessionMsg(sid, out, bus.OutputMsgID(sid, out.Payload.ToolCallID))
	if err != nil {
		f.h.t.Error(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, nm); err != nil && !errors.Is(err, context.Canceled) {
		f.h.t.Errorf("publish output: %v", err)
	}
}

func (f *fakeRunner) ran() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.jobs...)
}

// echo answers every job at once with "ran <id>".
func echo(job omni.ToolJob) *omni.Message {
	m := omni.ToolCallOutput(job.ToolCallID, "ran "+job.ToolCallID, omni.StatusCompleted)
	return &m
}

// index returns the position of the first message matching, or -1.
func index(msgs []omni.Message, match func(*omni.Message) bool) int {
	for i := range msgs {
		if match(&msgs[i]) {
			return i
		}
	}
	return -1
}

func isType(typ, callID string) func(*omni.Message) bool {
	return func(m *omni.Message) bool {
		return m.Payload.Type == typ && (callID == "" || m.Payload.ToolCallID == callID)
	}
}

// dump renders the stream compactly for failure messages.
func dump(msgs []omni.Message) string {
	var b strings.Builder
	for i, m := range msgs {
		fmt.Fprintf(&b, "\n%3d %s", i, m.Payload.Type)
		if m.Payload.EventType != "" {
			b.WriteString("/" + m.Payload.EventType)
		}
		if m.Payload.ToolCallID != "" {
			b.WriteString(" " + m.Payload.ToolCallID)
		}
		for _, s := range []string{m.Payload.Decision, m.Payload.Status, m.Payload.StopReason} {
			if s != "" {
				b.WriteString(" " + s)
			}
		}
		if len(m.Origin) > 0 {
			b.WriteString(" origin=" + strings.Join(m.Origin, "/"))
		}
	}
	return b.String()
}
