package toolrunner_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/toolrunner"
)

// wait bounds every poll of these tests.
const wait = 20 * time.Second

// TestMain gives exec_command's login shells an empty HOME, so the
// developer's shell profile cannot add output to the tests' commands.
func TestMain(m *testing.M) {
	if os.Getenv(stdioServerVar) != "" {
		serveStdio() // this binary is the MCP server a test started
		return
	}
	home, err := os.MkdirTemp("", "toolrunner-home-")
	if err != nil {
		panic(err)
	}
	os.Setenv("HOME", home)
	// goleak fails the package's tests when a goroutine outlives them.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(home)
		os.Exit(code)
	}))
}

// harness is one test's broker and Workspace.
type harness struct {
	t   *testing.T
	env *bustest.Env
	ws  string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return &harness{t: t, env: bustest.Start(t, bus.Config{}), ws: t.TempDir()}
}

// runner is one Run in the background, on its own connection.
type runner struct {
	id     string
	cancel context.CancelFunc
	done   chan error
	logs   *bustest.Buffer
}

// start runs a runner until the test ends (or stop is called).
func (h *harness) start(cfg toolrunner.Config) *runner {
	h.t.Helper()
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 100 * time.Millisecond
	}
	if cfg.RunnerID == "" {
		cfg.RunnerID = "runner-" + strings.ReplaceAll(h.t.Name(), "/", "-")
	}
	nc := bustest.Connect(h.t, h.env.Server)
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{id: cfg.RunnerID, cancel: cancel, done: make(chan error, 1), logs: &bustest.Buffer{}}
	go func() { r.done <- toolrunner.Run(ctx, nc, cfg, zerolog.New(r.logs)) }()
	h.t.Cleanup(func() {
		if err := r.stop(); err != nil {
			h.t.Errorf("Run: %v", err)
		}
	})
	return r
}

// stop cancels Run's context and returns its result; it fails the test if
// Run does not return in time.
func (r *runner) stop() error {
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // a second stop (cleanup) sees it too
		return err
	case <-time.After(wait):
		return errors.New("run did not return after its context ended")
	}
}

// execJob is an exec_command job running cmd in the harness Workspace.
func (h *harness) execJob(sid, id, cmd string) omni.ToolJob {
	args, err := json.Marshal(map[string]any{"description": "test", "cmd": cmd})
	if err != nil {
		h.t.Fatal(err)
	}
	return omni.ToolJob{SessionID: sid, ToolCallID: id, Name: "exec_command", Arguments: string(args),
		Workspace: h.ws, EnqueuedUnixMs: time.Now().UnixMilli()}
}

// enqueue publishes a job to the default pool and waits for it to be stored.
func (h *harness) enqueue(j omni.ToolJob) {
	h.t.Helper()
	m, err := bus.PackMsg(omni.ToolSubject(omni.DefaultPool, j.SessionID), j)
	if err != nil {
		h.t.Fatal(err)
	}
	h.publish(m)
}

func (h *harness) publish(m *nats.Msg) *jetstream.PubAck {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ack, err := h.env.JS.PublishMsg(ctx, m)
	if err != nil {
		h.t.Fatalf("publish %s: %v", m.Subject, err)
	}
	return ack
}

// streamed is one stored message of a Session.
type streamed struct {
	seq     uint64
	subject string
	msg     omni.Message
}

// session returns everything stored for sid, in stream order, each message
// decoded and validated.
func (h *harness) session(sid string) []streamed {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var out []streamed
	err := bus.Follow(ctx, h.env.JS, sid, nil, 0, true, func(m bus.StreamMsg) error {
		msg, err := omni.Decode(m.Data)
		if err != nil {
			h.t.Errorf("seq %d on %s: %v: %s", m.Seq, m.Subject, err, m.Data)
		}
		out = append(out, streamed{seq: m.Seq, subject: m.Subject, msg: msg})
		return nil
	})
	if err != nil {
		h.t.Fatalf("read session %s: %v", sid, err)
	}
	return out
}

// of returns the messages of one tool call.
func of(msgs []streamed, id string) []streamed {
	var out []streamed
	for _, m := range msgs {
		if m.msg.Payload.ToolCallID == id {
			out = append(out, m)
		}
	}
	return out
}

// completes returns the complete tool_call_outputs among msgs.
func completes(msgs []streamed) []streamed {
	var out []streamed
	for _, m := range msgs {
		if m.msg.Payload.Type == omni.TypeToolCallOutput {
			out = append(out, m)
		}
	}
	return out
}

// waitOutput waits for the complete output of (sid, id) and returns every
// message of that call.
func (h *harness) waitOutput(sid, id string) []streamed {
	h.t.Helper()
	var msgs []streamed
	bustest.Eventually(h.t, wait, "complete output of "+id, func() bool {
		msgs = of(h.session(sid), id)
		return len(completes(msgs)) > 0
	})
	return msgs
}

// checkSegment checks one call's messages: start, delta*, stop, then one
// complete output equal to the fragments' concatenation, published with the
// dedupe id. It returns the complete output's payload.
func (h *harness) checkSegment(sid string, msgs []streamed) omni.Payload {
	h.t.Helper()
	if len(msgs) < 3 {
		h.t.Fatalf("got %d messages, want start, stop and complete at least: %v", len(msgs), types(msgs))
	}
	var content strings.Builder
	for i, m := range msgs[:len(msgs)-1] {
		p := m.msg.Payload
		want := omni.EventDelta
		switch i {
		case 0:
			want = omni.EventStart
		case len(msgs) - 2:
			want = omni.EventStop
		}
		if p.Type != omni.TypePartialToolCallOutput || p.EventType != want || p.Role != omni.RoleUser {
			h.t.Fatalf("message %d = %s/%s (role %s), want %s/%s; all: %v", i, p.Type, p.EventType, p.Role, omni.TypePartialToolCallOutput, want, types(msgs))
		}
		if m.subject != omni.SessionSubject(sid, omni.ClassPartial) {
			h.t.Errorf("partial on %s, want %s", m.subject, omni.SessionSubject(sid, omni.ClassPartial))
		}
		content.WriteString(p.Content())
	}
	last := msgs[len(msgs)-1]
	p := last.msg.Payload
	if p.Type != omni.TypeToolCallOutput || p.Role != omni.RoleUser {
		h.t.Fatalf("last message is %s (role %s), want the complete %s", p.Type, p.Role, omni.TypeToolCallOutput)
	}
	if last.subject != omni.SessionSubject(sid, omni.ClassModel) {
		h.t.Errorf("complete output on %s, want %s", last.subject, omni.SessionSubject(sid, omni.ClassModel))
	}
	if content.String() != p.Output {
		h.t.Errorf("fragments concatenate to %q, complete output is %q", content.String(), p.Output)
	}
	stream, err := h.env.JS.Stream(context.Background(), omni.SessionsStream)
	if err != nil {
		h.t.Fatal(err)
	}
	raw, err := stream.GetMsg(context.Background(), last.seq)
	if err != nil {
		h.t.Fatal(err)
	}
	if got, want := raw.Header.Get(jetstream.MsgIDHeader), bus.OutputMsgID(sid, p.ToolCallID); got != want {
		h.t.Errorf("complete output Nats-Msg-Id = %q, want %q", got, want)
	}
	return p
}

func types(msgs []streamed) []string {
	var out []string
	for _, m := range msgs {
		s := m.msg.Payload.Type
		if m.msg.Payload.EventType != "" {
			s += "/" + m.msg.Payload.EventType
		}
		out = append(out, s)
	}
	return out
}

// heartbeats records every heartbeat of the Sessions matching a subject.
type heartbeats struct {
	mu    sync.Mutex
	beats []heartbeat
}

type heartbeat struct {
	sid string
	omni.Heartbeat
}

func (h *harness) watchHeartbeats(sid string) *heartbeats {
	h.t.Helper()
	hb := &heartbeats{}
	sub, err := h.env.Conn.Subscribe(omni.HeartbeatSubject(sid), func(m *nats.Msg) {
		var b omni.Heartbeat
		if err := omni.Unpack(m.Data, &b); err != nil {
			h.t.Errorf("heartbeat on %s: %v", m.Subject, err)
			return
		}
		hb.mu.Lock()
		hb.beats = append(hb.beats, heartbeat{sid: strings.TrimPrefix(m.Subject, omni.HeartbeatSubject("")), Heartbeat: b})
		hb.mu.Unlock()
	})
	if err != nil {
		h.t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	h.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := h.env.Conn.Flush(); err != nil {
		h.t.Fatal(err)
	}
	return hb
}

func (hb *heartbeats) all() []heartbeat {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return append([]heartbeat(nil), hb.beats...)
}

// naming returns the heartbeats that list id.
func (hb *heartbeats) naming(id string) []heartbeat {
	var out []heartbeat
	for _, b := range hb.all() {
		for _, x := range b.ToolCallIDs {
			if x == id {
				out = append(out, b)
				break
			}
		}
	}
	return out
}

// cancel sends a cancel request and returns the one reply.
func (h *harness) cancel(sid string, ids ...string) omni.CancelReply {
	h.t.Helper()
	m, err := bus.PackMsg(omni.CancelSubject(sid), omni.Cancel{ToolCallIDs: ids})
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := h.env.Conn.RequestMsg(m, wait)
	if err != nil {
		h.t.Fatalf("cancel %s %v: %v", sid, ids, err)
	}
	var reply omni.CancelReply
	if err := omni.Unpack(resp.Data, &reply); err != nil {
		h.t.Fatalf("cancel reply: %v", err)
	}
	return reply
}

// checkNoGoroutines fails if a goroutine of the toolrunner's code is still
// alive after a short grace: a job goroutine that has just called
// WaitGroup.Done may still be unwinding when Wait returns, so the stacks are
// sampled until none is left (a real leak stays past the grace).
// Only meaningful in a test that does not run in parallel with others.
func checkNoGoroutines(t *testing.T) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; {
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		left = left[:0]
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			if strings.Contains(g, "floe.dev/services/toolrunner/internal/") {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, g := range left {
		t.Errorf("goroutine left behind:\n%s", g)
	}
}
