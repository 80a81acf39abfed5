package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// fakeEngine is a small real engine for the gateway's tests: it takes Tasks
// from FLOE_TASKS, serves the control subjects of the Session it runs, and
// publishes a scripted answer on the Session's subjects the way the engine's
// contract says (task_state running first; record released with End before
// task_state idle; a pending approval registered before its approval_request
// is published).
type fakeEngine struct {
	t   testing.TB
	nc  *nats.Conn
	js  jetstream.JetStream
	env *bustest.Env

	// Deltas is the number of partial_text deltas of the answer.
	Deltas int
	// DeltaBytes pads every delta to at least this many bytes.
	DeltaBytes int
	// Tool adds a tool call (asking for approval under always-ask).
	Tool bool
	// Hold, when set, is called before delta i and may block.
	Hold func(ctx context.Context, sid string, i int)

	mu      sync.Mutex
	running map[string]*fakeTask // by session id
	// scopes are the Scope of each approve received, in order.
	scopes []string

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type fakeTask struct {
	task    omni.Task
	abort   chan struct{}
	aborted sync.Once
	steers  []string
	pending map[string]pendingCall // tool_call_id → call
}

type pendingCall struct {
	event    []byte // approval_request JSON
	decision chan string
}

func startEngine(t testing.TB, env *bustest.Env, configure func(*fakeEngine)) *fakeEngine {
	t.Helper()
	nc := bustest.Connect(t, env.Server)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEngine{t: t, nc: nc, js: js, env: env, Deltas: 5, running: make(map[string]*fakeTask)}
	if configure != nil {
		configure(e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	cons, err := js.CreateOrUpdateConsumer(ctx, omni.TasksStream, jetstream.ConsumerConfig{
		Durable: "fake-engine", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "floe.task.>",
		AckWait: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		m.Ack()
		var task omni.Task
		if err := omni.Unpack(m.Data(), &task); err != nil {
			t.Errorf("fake engine: bad task: %v", err)
			return
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.run(ctx, task)
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Stop()
		<-cc.Closed()
		cancel()
		e.wg.Wait()
	})
	return e
}

func (e *fakeEngine) publish(ctx context.Context, sid string, m omni.Message) {
	msg, err := bus.SessionMsg(sid, &m, "")
	if err != nil {
		e.t.Errorf("fake engine: %v", err)
		return
	}
	if _, err := e.js.PublishMsg(ctx, msg); err != nil && ctx.Err() == nil {
		e.t.Errorf("fake engine: publish: %v", err)
	}
}

func (e *fakeEngine) server(ctx context.Context, sid string, ev omni.ServerEvent) []byte {
	b, _ := json.Marshal(ev)
	if _, err := e.js.Publish(ctx, omni.SessionSubject(sid, omni.ClassServer), b); err != nil && ctx.Err() == nil {
		e.t.Errorf("fake engine: publish server event: %v", err)
	}
	return b
}

func (e *fakeEngine) run(ctx context.Context, task omni.Task) {
	sid := task.SessionID
	rec, _, err := e.env.Sessions.Get(ctx, sid)
	if err != nil || rec.TaskID != task.ID {
		return // not ours any more (cancelled, or deleted)
	}
	ft := &fakeTask{task: task, abort: make(chan struct{}), pending: make(map[string]pendingCall)}
	sub, err := e.nc.Subscribe("floe.ctl."+sid+".*", func(m *nats.Msg) { e.control(ft, m) })
	if err != nil {
		e.t.Errorf("fake engine: subscribe: %v", err)
		return
	}
	defer sub.Unsubscribe()
	e.nc.Flush()
	e.mu.Lock()
	e.running[sid] = ft
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.running, sid)
		e.mu.Unlock()
	}()

	state := omni.StateRunning
	if task.Kind == omni.TaskCompact {
		state = omni.StateCompacting
	}
	e.server(ctx, sid, omni.ServerEvent{Type: omni.ServerTaskState, State: state})
	status := omni.StatusCompleted
	if task.Kind == omni.TaskCompact {
		e.publish(ctx, sid, omni.CompactionBegin(omni.CompactManual, omni.ModeSummarize, 10, 1))
		e.publish(ctx, sid, omni.CompactionEnd(omni.CompactManual, omni.ModeSummarize, omni.StatusCompleted))
	} else {
		status = e.answer(ctx, sid, ft)
	}
	sub.Unsubscribe()
	// The record first, then the event: a snapshot read after the event was
	// published can never say running.
	if err := e.env.Sessions.End(context.Background(), sid, task.ID, status); err != nil {
		e.t.Errorf("fake engine: end: %v", err)
	}
	e.server(context.Background(), sid, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: status})
}

func (e *fakeEngine) aborted(ft *fakeTask) bool {
	select {
	case <-ft.abort:
		return true
	default:
		return false
	}
}

func (e *fakeEngine) answer(ctx context.Context, sid string, ft *fakeTask) string {
	for _, in := range ft.task.Input {
		if in.Type == "text" {
			e.publish(ctx, sid, omni.UserText(in.Text))
		}
	}
	e.publish(ctx, sid, omni.RequestBegin())
	e.publish(ctx, sid, omni.Partial(omni.TypeText, omni.EventStart, "", "", ""))
	var text strings.Builder
	for i := range e.Deltas {
		if e.Hold != nil {
			e.Hold(ctx, sid, i)
		}
		if e.aborted(ft) {
			return e.abortTurn(ctx, sid)
		}
		d := fmt.Sprintf("tok%d ", i)
		if len(d) < e.DeltaBytes {
			d += strings.Repeat("x", e.DeltaBytes-len(d))
		}
		text.WriteString(d)
		e.publish(ctx, sid, omni.Partial(omni.TypeText, omni.EventDelta, d, "", ""))
	}
	e.publish(ctx, sid, omni.Partial(omni.TypeText, omni.EventStop, "", "", ""))
	e.publish(ctx, sid, omni.Text(omni.RoleAssistant, text.String()))
	if e.Tool {
		const id = "call-1"
		args := `{"file_path":"a.txt"}`
		e.publish(ctx, sid, omni.Partial(omni.TypeToolCall, omni.EventStart, "", "read_file", id))
		e.publish(ctx, sid, omni.Partial(omni.TypeToolCall, omni.EventDelta, args, "read_file", id))
		e.publish(ctx, sid, omni.Partial(omni.TypeToolCall, omni.EventStop, "", "read_file", id))
		call := omni.ToolCall("read_file", args, id)
		e.publish(ctx, sid, call)
		decision := omni.DecisionAllow
		// The engine re-reads the approval mode before each decision.
		rec, _, err := e.env.Sessions.Get(ctx, sid)
		if err == nil && rec.ApprovalMode == omni.ApproveAlwaysAsk {
			callJSON := omni.MustMarshal(&call)
			ev, _ := json.Marshal(omni.ServerEvent{Type: omni.ServerApprovalRequest, ToolCall: callJSON})
			pc := pendingCall{event: ev, decision: make(chan string, 1)}
			e.mu.Lock()
			ft.pending[id] = pc // registered before it is published
			e.mu.Unlock()
			e.server(ctx, sid, omni.ServerEvent{Type: omni.ServerApprovalRequest, ToolCall: callJSON})
			select {
			case decision = <-pc.decision:
			case <-ft.abort:
				return e.abortTurn(ctx, sid)
			case <-ctx.Done():
				return omni.StatusAborted
			}
		}
		e.publish(ctx, sid, omni.ApprovalDecision(decision, id))
		out, stop := "1: hello", ""
		if decision != omni.DecisionAllow {
			out, stop = omni.DeniedByUser, omni.StatusAborted
		}
		e.publish(ctx, sid, omni.ToolCallOutput(id, out, stop))
	}
	e.publish(ctx, sid, omni.TokenUsage(omni.Usage{Output: 10, Total: 20}, omni.Usage{Output: 10, Total: 20}))
	e.publish(ctx, sid, omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	return omni.StatusCompleted
}

func (e *fakeEngine) abortTurn(ctx context.Context, sid string) string {
	e.publish(ctx, sid, omni.Partial(omni.TypeText, omni.EventStop, "", "", ""))
	e.publish(ctx, sid, omni.RequestEnd(omni.StatusAborted, "", 0, 0))
	e.publish(ctx, sid, omni.Abort("user"))
	return omni.StatusAborted
}

func (e *fakeEngine) control(ft *fakeTask, m *nats.Msg) {
	verb := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	var c omni.Control
	rep := omni.ControlReply{OK: true}
	if err := omni.Unpack(m.Data, &c); err != nil {
		rep = omni.ControlReply{Code: omni.CodeBadRequest, Message: err.Error()}
	} else {
		e.mu.Lock()
		switch verb {
		case omni.CtlApprove:
			e.scopes = append(e.scopes, c.Scope)
			pc, ok := ft.pending[c.ToolCallID]
			if ok {
				delete(ft.pending, c.ToolCallID)
				pc.decision <- c.Decision
			} else {
				rep = omni.ControlReply{Code: omni.CodeNotFound, Message: "no approval pending for " + c.ToolCallID}
			}
		case omni.CtlAbort:
			ft.aborted.Do(func() { close(ft.abort) })
		case omni.CtlSteer:
			ft.steers = append(ft.steers, c.Text)
		case omni.CtlRetryNow:
			rep.Skipped = false
		case omni.CtlPending:
			for _, pc := range ft.pending {
				rep.Pending = append(rep.Pending, pc.event)
			}
		default:
			rep = omni.ControlReply{Code: omni.CodeBadRequest, Message: "unknown verb " + verb}
		}
		e.mu.Unlock()
	}
	b, _ := omni.Pack(&rep)
	m.Respond(b)
}

// steers returns the steering texts the running Task of sid received.
func (e *fakeEngine) steers(sid string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ft := e.running[sid]; ft != nil {
		return append([]string(nil), ft.steers...)
	}
	return nil
}
