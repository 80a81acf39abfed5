package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

type env struct {
	t    *testing.T
	st   *stack.Stack
	home string
	ws   string
}

type envOpts struct {
	runners int // tool runner replicas (default 1)
	// mcpConfig is the runners' FLOE_MCP_CONFIG file (empty: none).
	mcpConfig string
	engine    func(*engine.Config)
	noTrace   bool
	// log, when set, receives every service's log lines (JSON).
	log *bustest.Buffer
}

func start(t *testing.T, o envOpts) *env {
	t.Helper()
	e, stop := startOn(t, t.TempDir(), o)
	t.Cleanup(stop)
	return e
}

// startOn starts the stack and o.runners tool runners on home, and
// returns the env and a function that stops the runners, then the stack.
func startOn(t *testing.T, home string, o envOpts) (*env, func()) {
	t.Helper()
	// Commands run in a login shell; keep the machine's profile (and
	// anything slow or stateful in it) out of the tests.
	t.Setenv("HOME", home)
	ws := filepath.Join(home, "workspaces", "ws") // under $FLOE_HOME only in workspaces/
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	eng := engine.Config{RetryMax: 5, RetryBase: 20 * time.Millisecond, RetryCap: 100 * time.Millisecond, HeartbeatTimeout: 2 * time.Second, Home: home}
	if o.engine != nil {
		o.engine(&eng)
	}
	opts := stack.Options{Home: home, Listen: "off", Engine: &eng}
	if !o.noTrace {
		opts.Tracer = &tracer.Config{Home: home}
	}
	log := testLogger()
	if o.log != nil {
		log = zerolog.New(o.log)
	}
	st, err := stack.Start(context.Background(), opts, log)
	if err != nil {
		t.Fatal(err)
	}
	if o.runners == 0 {
		o.runners = 1
	}
	var stops []func()
	stop := func() {
		for _, s := range stops {
			s()
		}
		st.Stop()
	}
	for i := 0; i < o.runners; i++ {
		nc, err := st.Server.Connect()
		if err != nil {
			stop()
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		cfg := toolrunner.Config{RunnerID: fmt.Sprintf("runner-%d", i), MCPConfig: o.mcpConfig}
		go func() {
			defer close(done)
			_ = toolrunner.Run(ctx, nc, cfg, testLogger())
		}()
		stops = append(stops, func() { cancel(); <-done; nc.Close() })
	}
	return &env{t: t, st: st, home: home, ws: ws}, stop
}

var seq atomic.Int64

// session creates a Session record.
func (e *env) session(modelRef, mode string, tweak func(*omni.SessionRecord)) string {
	e.t.Helper()
	now := time.Now().UTC()
	sid := omni.NewSessionID(now, fmt.Sprintf("%08x", seq.Add(1)))
	rec := &omni.SessionRecord{ID: sid, Model: modelRef, Workspace: e.ws, ApprovalMode: mode,
		State: omni.StateIdle, CreatedUnixMs: now.UnixMilli()}
	if tweak != nil {
		tweak(rec)
	}
	if err := e.st.Sessions.Create(context.Background(), rec); err != nil {
		e.t.Fatal(err)
	}
	return sid
}

// script writes a scripted model file and returns its model reference.
func (e *env) script(v any) string {
	e.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		e.t.Fatal(err)
	}
	p := filepath.Join(e.t.TempDir(), "script.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		e.t.Fatal(err)
	}
	return "scripted:" + p
}

// submit starts a Task and returns its id.
func (e *env) submit(sid, prompt string) string {
	e.t.Helper()
	return e.submitTask(sid, omni.TaskRun, omni.InputPart{Type: "text", Text: prompt})
}

// submitTask publishes a Task of kind run or compact, moving the Session
// to running or compacting first, as the gateway does.
func (e *env) submitTask(sid, kind string, input ...omni.InputPart) string {
	e.t.Helper()
	ctx := context.Background()
	id := fmt.Sprintf("task-%d", seq.Add(1))
	state := omni.StateRunning
	if kind == omni.TaskCompact {
		state = omni.StateCompacting
	}
	if _, err := e.st.Sessions.Begin(ctx, sid, state, id); err != nil {
		e.t.Fatal(err)
	}
	nm, err := bus.PackMsg(omni.TaskSubject(sid), &omni.Task{ID: id, Kind: kind, SessionID: sid, Input: input})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.st.JS.PublishMsg(ctx, nm); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// rec is one stream message.
type rec struct {
	seq   uint64
	class string
	raw   []byte
	msg   omni.Message     // for OmniMessage classes
	ev    omni.ServerEvent // for server
}

// wait reads the Session's stream until task taskID goes idle and returns
// everything up to that point and the Task's status.
func (e *env) wait(sid, taskID string) ([]rec, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []rec
	status := ""
	err := bus.FollowUntil(ctx, e.st.JS, sid, nil, 0, false, func(sm bus.StreamMsg) error {
		r := rec{seq: sm.Seq, class: sm.Class, raw: append([]byte(nil), sm.Data...)}
		if sm.Class == omni.ClassServer {
			if err := json.Unmarshal(sm.Data, &r.ev); err != nil {
				e.t.Errorf("bad server event %s: %v", sm.Data, err)
			}
			out = append(out, r)
			if r.ev.Type == omni.ServerTaskState && r.ev.State == omni.StateIdle && r.ev.TaskID == taskID {
				status = r.ev.Status
				return bus.ErrStop
			}
			return nil
		}
		m, err := omni.Decode(sm.Data)
		if err != nil {
			e.t.Errorf("undecodable message at %d: %v: %s", sm.Seq, err, sm.Data)
			return nil
		}
		r.msg = m
		out = append(out, r)
		return nil
	})
	if err != nil {
		e.t.Fatalf("waiting for task %s: %v (got %d messages)", taskID, err, len(out))
	}
	return out, status
}

// label names a message compactly: "request_begin", "tool_call:call_a",
// "partial_text:start", "approval_decision:allow:call_a", "server:task_state".
func label(r rec) string {
	if r.class == omni.ClassServer {
		return "server:" + r.ev.Type
	}
	p := &r.msg.Payload
	if r.msg.Type == omni.KindSessionMeta {
		return "session_meta"
	}
	s := p.Type
	if p.EventType != "" {
		s += ":" + p.EventType
	}
	if p.Decision != "" {
		s += ":" + p.Decision
	}
	if p.Status != "" {
		s += ":" + p.Status
	}
	if p.ToolCallID != "" {
		s += ":" + p.ToolCallID
	}
	return s
}

func labels(rs []rec, keep func(rec) bool) []string {
	var out []string
	for _, r := range rs {
		if keep == nil || keep(r) {
			out = append(out, label(r))
		}
	}
	return out
}

func noPartials(r rec) bool { return r.class != omni.ClassServer && !r.msg.IsPartial() }

func indexOf(ls []string, want string) int {
	for i, l := range ls {
		if l == want {
			return i
		}
	}
	return -1
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkDiscipline asserts the streaming discipline and pairing over a
// stream: per producer, segments never overlap; each goes start → delta*
// → stop and its complete message follows, equal to the concatenation.
func checkDiscipline(t *testing.T, rs []rec) {
	t.Helper()
	type seg struct {
		key     string
		content strings.Builder
		stopped bool
	}
	open := map[string]*seg{} // by producer: "model" or tool_call_id (outputs)
	producer := func(m *omni.Message) string {
		base := strings.Join(m.Origin, "/") + "|"
		if m.Payload.Type == omni.TypePartialToolCallOutput || m.Payload.Type == omni.TypeToolCallOutput {
			return base + "out:" + m.Payload.ToolCallID
		}
		return base + "model"
	}
	for _, r := range rs {
		if r.class == omni.ClassServer || r.msg.Type != omni.KindModel {
			continue
		}
		m := &r.msg
		if m.Payload.Role == omni.RoleUser && m.Payload.Type == omni.TypeText {
			continue
		}
		pr := producer(m)
		k := omni.CompleteType(m.Payload.Type)
		if k == "" {
			k = m.Payload.Type
		}
		k += "|" + m.Payload.ToolCallID
		s := open[pr]
		if m.IsPartial() {
			switch m.Payload.EventType {
			case omni.EventStart:
				if s != nil {
					t.Fatalf("seq %d: %s starts while %s is open", r.seq, k, s.key)
				}
				s = &seg{key: k}
				open[pr] = s
			default:
				if s == nil || s.key != k || s.stopped {
					t.Fatalf("seq %d: %s %s without an open segment", r.seq, k, m.Payload.EventType)
				}
			}
			s.content.WriteString(m.Payload.Content())
			if m.Payload.EventType == omni.EventStop {
				s.stopped = true
			}
			continue
		}
		if m.Payload.Type == omni.TypeImageURL {
			continue
		}
		if s == nil && m.Payload.Type == omni.TypeToolCallOutput {
			continue // a synthetic output (denied, lost runner) has no segment
		}
		if s == nil || !s.stopped || s.key != k {
			t.Fatalf("seq %d: complete %s not right after its segment's stop", r.seq, k)
		}
		if got, want := s.content.String(), m.Payload.Content(); got != want {
			t.Fatalf("seq %d: deltas of %s concatenate to %q, complete says %q", r.seq, k, got, want)
		}
		delete(open, pr)
	}
}

// testLogger logs to stderr when FLOE_TEST_LOG is set.
func testLogger() zerolog.Logger {
	if os.Getenv("FLOE_TEST_LOG") != "" {
		return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Logger()
	}
	return zerolog.Nop()
}
