package gwe2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/cmd/floe/internal/proctest"
	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

// waitLimit bounds every wait of a test step: generous, since the machine
// is shared, and never an assertion about speed.
const waitLimit = 45 * time.Second

// env is a whole Floe in one process: embedded nats-server, engine, tool
// runner, tracer and the stack's gateway on a loopback port.
type env struct {
	t    *testing.T
	st   *stack.Stack
	home string
	ws   string
	url  string         // the stack's gateway
	c    *client.Client // a client of it
}

// start brings the stack up. HOME is a temporary directory, so the tools'
// login shell loads no profile of the machine.
func start(t *testing.T) *env { t.Helper(); return startWith(t, nil) }

// startWith is start with the engine's Config adjusted by tune.
func startWith(t *testing.T, tune func(*engine.Config)) *env {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	ws := filepath.Join(home, "workspaces", "ws") // under $FLOE_HOME only in workspaces/
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	eng := engine.Config{RetryMax: 5, RetryBase: 20 * time.Millisecond, RetryCap: 100 * time.Millisecond,
		HeartbeatTimeout: 5 * time.Second, Home: home}
	if tune != nil {
		tune(&eng)
	}
	tr := toolrunner.Config{RunnerID: "runner-0"}
	var st *stack.Stack
	var addr string
	// The gateway listens on a port picked free just before; if something
	// else took it meanwhile, try another.
	for attempt := 0; ; attempt++ {
		addr = freeAddr(t)
		gw := gateway.Config{Addr: addr, Home: home, ShutdownTimeout: 5 * time.Second, ScriptsDir: os.TempDir()}
		var err error
		st, err = stack.Start(context.Background(), stack.Options{
			Home: home, Listen: "off", Bus: bus.Config{Memory: true},
			Engine: &eng, Toolrunner: &tr, Tracer: &tracer.Config{Home: home}, Gateway: &gw,
		}, testLogger())
		if err != nil {
			t.Fatal(err)
		}
		if waitHealthy("http://"+addr, st.Err) == nil {
			break
		}
		st.Stop()
		if attempt == 2 {
			t.Fatalf("the stack's gateway did not come up on %s: %v", addr, st.Err())
		}
	}
	t.Cleanup(st.Stop)
	url := "http://" + addr
	return &env{t: t, st: st, home: home, ws: ws, url: url, c: client.New(url)}
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string { return proctest.FreeAddr(t) }

// waitHealthy polls GET /healthz until it answers 200; failed, when set,
// reports a reason to give up early.
func waitHealthy(url string, failed func() error) error {
	c := client.New(url, client.WithHTTPClient(&http.Client{Timeout: 2 * time.Second}))
	deadline := time.Now().Add(waitLimit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := c.Health(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if failed != nil {
			if ferr := failed(); ferr != nil {
				return ferr
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy after %v: %w", url, waitLimit, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// gwInstance is one more gateway replica on the stack's bus, with its own
// NATS connection, run by gateway.Run as `floe gateway` runs it.
type gwInstance struct {
	addr   string
	url    string
	cancel context.CancelFunc
	done   chan error
	nc     *nats.Conn
	c      *client.Client
}

// startGateway runs another gateway on addr ("" = a free port).
func (e *env) startGateway(addr string) *gwInstance {
	e.t.Helper()
	attempts := 3 // a fresh free port each time
	if addr != "" {
		attempts = 20 // the same port: its old listener may still be closing
	}
	for attempt := 1; ; attempt++ {
		a := addr
		if a == "" {
			a = freeAddr(e.t)
		}
		g, err := e.tryGateway(a)
		if err == nil {
			e.t.Cleanup(g.stop)
			return g
		}
		if attempt == attempts {
			e.t.Fatalf("gateway on %s: %v", a, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) tryGateway(addr string) (*gwInstance, error) {
	nc, err := e.st.Server.Connect(nats.Name("floe-gateway-extra"))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &gwInstance{addr: addr, url: "http://" + addr, cancel: cancel, done: make(chan error, 1), nc: nc}
	go func() {
		g.done <- gateway.Run(ctx, nc, gateway.Config{Addr: addr, Home: e.home, ShutdownTimeout: 5 * time.Second, ScriptsDir: os.TempDir()}, testLogger())
	}()
	var runErr error
	err = waitHealthy(g.url, func() error {
		select {
		case runErr = <-g.done:
			return fmt.Errorf("gateway stopped: %w", runErr)
		default:
			return nil
		}
	})
	if err != nil {
		cancel()
		if runErr == nil {
			<-g.done
		}
		nc.Close()
		return nil, err
	}
	g.c = client.New(g.url)
	return g, nil
}

// stop ends the gateway (its SSE streams end, clients resume elsewhere)
// and waits for Run to return. Stopping twice is fine.
func (g *gwInstance) stop() {
	if g.cancel == nil {
		return
	}
	g.cancel()
	g.cancel = nil
	select {
	case <-g.done:
	case <-time.After(waitLimit):
		panic("gateway did not stop within " + waitLimit.String())
	}
	g.nc.Close()
}

// script writes a scripted model file and returns its model reference.
func script(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "script.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return "scripted:" + p
}

// obj is a JSON object literal for scripts.
type obj = map[string]any

// ctxT is a context bounded by waitLimit, cancelled at the test's end.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// session creates a Session through the API.
func (e *env) session(c *client.Client, req client.CreateSession) string {
	e.t.Helper()
	if req.Workspace == "" {
		req.Workspace = e.ws
	}
	return createSession(e.t, c, req)
}

func createSession(t *testing.T, c *client.Client, req client.CreateSession) string {
	t.Helper()
	if req.Workspace != "" {
		// The gateway creates only default Workspaces.
		if err := os.MkdirAll(req.Workspace, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.CreateSession(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return s.ID
}

// submit starts a Task through the API.
func submit(t *testing.T, c *client.Client, sid, prompt string) string {
	t.Helper()
	id, err := c.SubmitTask(ctxT(t), sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: prompt}}})
	if err != nil {
		t.Fatalf("submit %q: %v", prompt, err)
	}
	return id
}

// sse is one SSE stream of a Session read by a test.
type sse struct {
	t      *testing.T
	s      *client.Stream
	cancel context.CancelFunc
	got    []client.Event
	closed bool
}

// stream opens a Session's SSE stream, resuming after last when set.
func stream(t *testing.T, c *client.Client, sid, last string) *sse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.Stream(ctx, sid, last, client.WithReconnectDelay(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		cancel()
		t.Fatalf("open stream of %s after %q: %v", sid, last, err)
	}
	x := &sse{t: t, s: s, cancel: cancel}
	t.Cleanup(x.close)
	return x
}

// next returns the next event; it fails the test after waitLimit or when
// the stream ends.
func (x *sse) next(what string) client.Event {
	x.t.Helper()
	select {
	case ev, ok := <-x.s.C:
		if !ok {
			x.t.Fatalf("stream ended (%v) while waiting for %s; got %s", x.s.Err(), what, describe(x.got))
		}
		x.got = append(x.got, ev)
		return ev
	case <-time.After(waitLimit):
		x.t.Fatalf("timed out after %v waiting for %s; got %s", waitLimit, what, describe(x.got))
	}
	panic("unreachable")
}

// until reads events until cond holds for one and returns it.
func (x *sse) until(what string, cond func(client.Event) bool) client.Event {
	x.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		ev := x.next(what)
		if cond(ev) {
			return ev
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("timed out after %v waiting for %s; got %s", waitLimit, what, describe(x.got))
		}
	}
}

// close ends the stream and keeps every event it had handed over, so the
// last id in got is where a resume starts.
func (x *sse) close() {
	if x.closed {
		return
	}
	x.closed = true
	x.cancel()
	for ev := range x.s.C {
		x.got = append(x.got, ev)
	}
	<-x.s.Done()
}

// lastID closes the stream and returns the id a client resumes from; it
// checks it is the id of the last event received.
func (x *sse) lastID() string {
	x.t.Helper()
	x.close()
	id := x.s.LastEventID()
	if got := lastIDOf(x.got); got != id {
		x.t.Fatalf("LastEventID %q, but the last event with an id the client got is %q", id, got)
	}
	return id
}

func lastIDOf(evs []client.Event) string {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].ID != "" {
			return evs[i].ID
		}
	}
	return ""
}

// parseID splits an SSE id <epoch>-<seq>.
func parseID(t *testing.T, id string) (epoch int64, seq uint64) {
	t.Helper()
	e, s, ok := strings.Cut(id, "-")
	if !ok {
		t.Fatalf("event id %q is not <epoch>-<seq>", id)
	}
	epoch, err1 := strconv.ParseInt(e, 10, 64)
	seq, err2 := strconv.ParseUint(s, 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("event id %q is not <epoch>-<seq>", id)
	}
	return epoch, seq
}

func seqOf(t *testing.T, id string) uint64 {
	_, s := parseID(t, id)
	return s
}

// serverEv decodes a server event; ok is false for an OmniMessage.
func serverEv(ev client.Event) (omni.ServerEvent, bool) {
	var se omni.ServerEvent
	if ev.Event != client.EventServer || json.Unmarshal(ev.Data, &se) != nil {
		return se, false
	}
	return se, true
}

// msgOf decodes an OmniMessage event; ok is false for a server event.
func msgOf(ev client.Event) (omni.Message, bool) {
	if ev.Event != "" {
		return omni.Message{}, false
	}
	m, err := omni.Decode(ev.Data)
	return m, err == nil
}

func isTaskState(ev client.Event, state string) bool {
	se, ok := serverEv(ev)
	return ok && se.Type == omni.ServerTaskState && (state == "" || se.State == state)
}

// idleOf matches the task_state idle the stream carries (with an id) at
// the end of Task task.
func idleOf(task string) func(client.Event) bool {
	return func(ev client.Event) bool {
		se, ok := serverEv(ev)
		return ok && ev.ID != "" && se.Type == omni.ServerTaskState && se.State == omni.StateIdle && se.TaskID == task
	}
}

// approvalFor matches an approval_request for call id (live or re-sent).
func approvalFor(id string) func(client.Event) bool {
	return func(ev client.Event) bool {
		return approvalCallID(ev) == id
	}
}

func approvalCallID(ev client.Event) string {
	se, ok := serverEv(ev)
	if !ok || se.Type != omni.ServerApprovalRequest {
		return ""
	}
	var tc omni.Message
	if omni.Unmarshal(se.ToolCall, &tc) != nil {
		return ""
	}
	return tc.Payload.ToolCallID
}

// label names an event compactly for failure messages.
func label(ev client.Event) string {
	id := ev.ID
	if id == "" {
		id = "-"
	}
	if se, ok := serverEv(ev); ok {
		s := "server:" + se.Type
		if se.State != "" {
			s += ":" + se.State
		}
		if se.Status != "" {
			s += ":" + se.Status
		}
		if c := approvalCallID(ev); c != "" {
			s += ":" + c
		}
		if len(se.Origin) > 0 {
			s += fmt.Sprintf(":origin=%v", se.Origin)
		}
		return id + " " + s
	}
	m, ok := msgOf(ev)
	if !ok {
		return id + " ?" + string(ev.Data)
	}
	return id + " " + msgLabel(&m)
}

func msgLabel(m *omni.Message) string {
	if m.Type == omni.KindSessionMeta {
		return "session_meta"
	}
	p := &m.Payload
	s := p.Type
	for _, f := range []string{p.EventType, p.Decision, p.Status, p.ToolCallID} {
		if f != "" {
			s += ":" + f
		}
	}
	if len(m.Origin) > 0 {
		s = fmt.Sprintf("%v/%s", m.Origin, s)
	}
	return s
}

func describe(evs []client.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString("\n  ")
		b.WriteString(label(ev))
	}
	return b.String()
}

// busMsgs reads a Session's messages of classes from the stream's start
// until stop holds for one (included).
func (e *env) busMsgs(sid string, classes []string, stop func(bus.StreamMsg) bool) []bus.StreamMsg {
	e.t.Helper()
	return followBus(e.t, e.st.JS, sid, classes, stop)
}

func followBus(t *testing.T, js jetstream.JetStream, sid string, classes []string, stop func(bus.StreamMsg) bool) []bus.StreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var out []bus.StreamMsg
	err := bus.FollowUntil(ctx, js, sid, classes, 0, false, func(sm bus.StreamMsg) error {
		sm.Data = bytes.Clone(sm.Data)
		out = append(out, sm)
		if stop(sm) {
			return bus.ErrStop
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s from the bus: %v (got %d)", sid, err, len(out))
	}
	return out
}

// busAll reads a Session's messages of classes stored so far.
func busAll(t *testing.T, js jetstream.JetStream, sid string, classes []string) []bus.StreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var out []bus.StreamMsg
	err := bus.FollowUntil(ctx, js, sid, classes, 0, true, func(sm bus.StreamMsg) error {
		sm.Data = bytes.Clone(sm.Data)
		out = append(out, sm)
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s from the bus: %v (got %d)", sid, err, len(out))
	}
	return out
}

// untilIdle stops a bus read at Task task's task_state idle.
func untilIdle(task string) func(bus.StreamMsg) bool {
	return func(sm bus.StreamMsg) bool {
		if sm.Class != omni.ClassServer {
			return false
		}
		var se omni.ServerEvent
		return json.Unmarshal(sm.Data, &se) == nil && se.Type == omni.ServerTaskState && se.State == omni.StateIdle && se.TaskID == task
	}
}

// sameAsBus checks that the events with ids are exactly want, the bus's
// client stream: same sequences in order (no gap, no duplicate), the same
// epoch throughout, server events named server_event, the bytes verbatim.
func sameAsBus(t *testing.T, got []client.Event, want []bus.StreamMsg) {
	t.Helper()
	var withID []client.Event
	for _, ev := range got {
		if ev.ID != "" {
			withID = append(withID, ev)
		}
	}
	var epoch0 int64
	for i := 0; i < len(withID) || i < len(want); i++ {
		if i >= len(withID) {
			t.Fatalf("the client misses seq %d (%s) and %d more; got %s", want[i].Seq, want[i].Data, len(want)-i-1, describe(withID))
		}
		if i >= len(want) {
			t.Fatalf("the client got %s beyond the bus's %d messages", label(withID[i]), len(want))
		}
		ev, sm := withID[i], want[i]
		epoch, seq := parseID(t, ev.ID)
		if i == 0 {
			epoch0 = epoch
		}
		if epoch != epoch0 {
			t.Fatalf("event %s: epoch changed from %d", ev.ID, epoch0)
		}
		if seq != sm.Seq {
			t.Fatalf("client event %d has seq %d, the bus has %d (%s) there (gap or duplicate); got %s", i, seq, sm.Seq, sm.Data, describe(withID))
		}
		if isServer := ev.Event == client.EventServer; isServer != (sm.Class == omni.ClassServer) {
			t.Fatalf("seq %d: event name %q for class %s", seq, ev.Event, sm.Class)
		}
		if !bytes.Equal(ev.Data, sm.Data) {
			t.Fatalf("seq %d: client data %s, bus data %s", seq, ev.Data, sm.Data)
		}
	}
}

// waitTracer waits until the tracer has written the Session up to seq.
func waitTracer(t *testing.T, home, sid string, seq uint64) trace.Pos {
	t.Helper()
	var pos trace.Pos
	eventually(t, "the tracer to reach seq "+strconv.FormatUint(seq, 10), func() bool {
		p, ok, err := trace.ReadPos(home, sid)
		pos = p
		return err == nil && ok && p.Seq >= seq
	})
	return pos
}

// traceRecords reads every record of the Session's Trace files.
func traceRecords(t *testing.T, home, sid string) [][]byte {
	t.Helper()
	files, err := trace.Files(home, sid)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no Trace files for %s", sid)
	}
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.Split(b, []byte{'\n'}) {
			if len(bytes.TrimSpace(line)) > 0 {
				out = append(out, line)
			}
		}
	}
	return out
}

// eventually polls cond until it holds, failing after waitLimit.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitLimit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// apiStatus returns the HTTP status of an *client.APIError, 0 otherwise.
func apiStatus(err error) int {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// testLogger logs to stderr when FLOE_TEST_LOG is set.
func testLogger() zerolog.Logger {
	if os.Getenv("FLOE_TEST_LOG") != "" {
		return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Logger()
	}
	return zerolog.Nop()
}

// longText is n distinct words, for answers streamed in many chunks.
func longText(prefix string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "%s%03d ", prefix, i)
	}
	return strings.TrimSpace(b.String())
}

// isTextPartial matches a partial text fragment of the Session itself.
func isTextPartial(ev client.Event) bool {
	m, ok := msgOf(ev)
	return ok && len(m.Origin) == 0 && m.Payload.Type == omni.TypePartialText
}

func count(evs []client.Event, f func(client.Event) bool) int {
	n := 0
	for _, ev := range evs {
		if f(ev) {
			n++
		}
	}
	return n
}

// cursorSeq checks that a /messages live cursor is in the SSE id format
// "<epoch>-<seq>" (protocol.md §3) and returns its sequence.
func cursorSeq(t testing.TB, l *client.Live) uint64 {
	t.Helper()
	epoch, seq, ok := client.ParseEventID(l.Cursor)
	if !ok || epoch <= 0 {
		t.Fatalf("live cursor %q is not <epoch>-<seq>", l.Cursor)
	}
	return seq
}
