package gwe2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/cmd/floe/internal/proctest"
	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// lockedBuffer collects a process's output; safe for concurrent use.
type lockedBuffer = proctest.Buffer

// serveHome is what a `floe serve` process runs on: its home and the
// loopback addresses it keeps across restarts.
type serveHome struct {
	t        *testing.T
	dir      string // HOME; FLOE_HOME is dir/floe
	httpAddr string
	natsAddr string
	model    string
	extraEnv []string // more variables for the processes
}

func newServeHome(t *testing.T, model string) *serveHome {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("HOME", dir)
	return &serveHome{t: t, dir: dir, httpAddr: freeAddr(t), natsAddr: freeAddr(t), model: model}
}

func (h *serveHome) floeHome() string { return filepath.Join(h.dir, "floe") }
func (h *serveHome) url() string      { return "http://" + h.httpAddr }

// env is the environment of a fresh machine (no provider, no FLOE_*
// settings of the caller) pointed at this home.
func (h *serveHome) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FLOE_") || strings.HasPrefix(k, "OPENAI_") || strings.HasPrefix(k, "ANTHROPIC_") || k == "HOME" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+h.dir, "FLOE_HOME="+h.floeHome(),
		"FLOE_HTTP_ADDR="+h.httpAddr, "FLOE_NATS_LISTEN="+h.natsAddr, "FLOE_MODEL="+h.model,
		"FLOE_RETRY_BASE_MS=20", "FLOE_RETRY_CAP_MS=100", "FLOE_LOG_LEVEL=info",
		"FLOE_SCRIPTS_DIR="+os.TempDir()) // the tests' scripts live in t.TempDir()
	return append(env, h.extraEnv...) // last: they override
}

// proc is a running floe process.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer // stdout
	errs *lockedBuffer // stderr
	done chan struct{}
	err  error // Wait's result, once done is closed
}

func (h *serveHome) start(args ...string) *proc {
	h.t.Helper()
	return h.startCmd(exec.Command(floeBin, args...), "floe "+strings.Join(args, " "))
}

// startCmd starts cmd (floe, possibly through a wrapper) in this home.
func (h *serveHome) startCmd(cmd *exec.Cmd, name string) *proc {
	h.t.Helper()
	p := &proc{t: h.t, name: name, cmd: cmd, out: &lockedBuffer{}, errs: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd.Env = append(h.env(), p.cmd.Env...)
	p.cmd.Dir = h.dir
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.errs
	if err := p.cmd.Start(); err != nil {
		h.t.Fatalf("start %s: %v", p.name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	h.t.Cleanup(p.kill)
	return p
}

// serve starts `floe serve` and waits until its gateway answers.
func (h *serveHome) serve() *proc {
	h.t.Helper()
	p := h.start("serve")
	err := waitHealthy(h.url(), func() error {
		select {
		case <-p.done:
			return errors.New("floe serve exited: " + errString(p.err))
		default:
			return nil
		}
	})
	if err != nil {
		h.t.Fatalf("%v\nstderr:\n%s", err, p.errs.String())
	}
	return p
}

func errString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// wait waits (bounded) for the process to exit and returns its exit code.
func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(waitLimit):
		p.kill()
		p.t.Fatalf("%s did not exit within %v\nstdout:\n%s\nstderr:\n%s", p.name, waitLimit, p.out.String(), p.errs.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		select {
		case <-p.done:
		default:
			p.t.Fatalf("signal %s: %v", p.name, err)
		}
	}
	if code := p.wait(); code != 0 {
		p.t.Fatalf("%s exited %d after SIGTERM\nstderr:\n%s", p.name, code, p.errs.String())
	}
}

// kill ends a leftover process (by its own pid) and reaps it.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	if p.t.Failed() {
		p.t.Logf("%s stderr:\n%s", p.name, p.errs.String())
	}
}

// jsOf connects to the serve process's embedded NATS (the listener `nats`
// CLI users get), to read the bus directly.
func (h *serveHome) jsOf() jetstream.JetStream {
	h.t.Helper()
	// As admin, with the password the serve process generated.
	pw, err := os.ReadFile(embed.PasswordFile(stack.CredentialsDir(h.floeHome()), embed.UserAdmin))
	if err != nil {
		h.t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+h.natsAddr, nats.Timeout(5*time.Second), nats.UserInfo(embed.UserAdmin, strings.TrimSpace(string(pw))))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		h.t.Fatal(err)
	}
	return js
}

// `floe serve` stopped with SIGTERM and started again on the same home:
// an SSE client resumes with the Last-Event-ID it had before the restart
// and gets exactly the events after it (the end of the Task it had not read
// yet, task_state idle included), then the snapshot; /messages shows the
// history; a new Task runs on the committed context.
func TestServeRestartKeepsStreamHistoryAndContext(t *testing.T) {
	answer := "Remember this: " + longText("fact", 60)
	// One request, played by every Task: the scripted model's per-Session
	// counter starts over with the process. Its usage is estimated from the
	// request, so it shows how much context the model got.
	file := filepath.Join(t.TempDir(), "serve.json")
	writeJSON(t, file, obj{"requests": []any{
		obj{"expect_last_user": "ping", "steps": []any{obj{"text": answer, "chunks": 12, "delay_ms": 5}}},
	}, "after_last": "repeat_last"})
	h := newServeHome(t, "scripted:"+file)
	p := h.serve()
	c := client.New(h.url())
	sid := createSession(t, c, client.CreateSession{Workspace: h.dir})
	if s, err := c.GetSession(ctxT(t), sid); err != nil || s.Model != "scripted:"+file {
		t.Fatalf("session model = %v, %v; want FLOE_MODEL's", s, err)
	}

	s0 := stream(t, c, sid, "")
	task1 := submit(t, c, sid, "ping one")
	// The client reads up to the complete answer and stops there: what
	// follows (token_usage, request_end, task_state idle) is its gap.
	answered := s0.until("the complete answer", func(ev client.Event) bool {
		m, ok := msgOf(ev)
		return ok && m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleAssistant
	})
	read := append([]client.Event(nil), s0.got...)
	last := answered.ID
	s0.close()
	eventually(t, "the task to end", func() bool {
		s, err := c.GetSession(ctxT(t), sid)
		return err == nil && s.State == omni.StateIdle && s.LastStatus == omni.StatusCompleted
	})
	p.stop()

	p = h.serve()
	js := h.jsOf()
	s1 := stream(t, c, sid, last)
	snap := s1.until("the snapshot", func(ev client.Event) bool { return ev.ID == "" })
	if !isTaskState(snap, omni.StateIdle) {
		t.Fatalf("after the replay came %s, want task_state idle", label(snap))
	}
	gap := s1.got[:len(s1.got)-1]
	if len(gap) == 0 || !idleOf(task1)(gap[len(gap)-1]) {
		t.Fatalf("the replayed gap does not end with the task's task_state idle:%s", describe(gap))
	}
	want := followBus(t, js, sid, omni.ClientClasses, untilIdle(task1))
	sameAsBus(t, append(read, gap...), want)
	s1.close()

	// /messages: the history is the Trace's records, the Session's own
	// meta|model|event messages.
	hist, err := c.Messages(ctxT(t), sid)
	if err != nil {
		t.Fatal(err)
	}
	if hist.Live != nil {
		t.Fatalf("/messages of an idle Session has a live part")
	}
	rec := busAll(t, js, sid, omni.TraceClasses)
	if len(hist.Messages) != len(rec) {
		t.Fatalf("/messages has %d messages, the bus %d", len(hist.Messages), len(rec))
	}
	for i := range rec {
		if !bytes.Equal(hist.Messages[i], rec[i].Data) {
			t.Fatalf("/messages[%d] = %s, bus %s", i, hist.Messages[i], rec[i].Data)
		}
	}
	if !strings.Contains(string(bytes.Join(toBytes(hist.Messages), nil)), answer) {
		t.Fatalf("/messages lacks the first answer")
	}

	// A new Task on the restarted server continues the Session: it
	// completes (the script checks the prompt), and its request carried the
	// first Task's messages (the estimated usage grew by the answer).
	s2 := stream(t, c, sid, "")
	task2 := submit(t, c, sid, "ping two")
	end := s2.until("the second task's end", idleOf(task2))
	if se, _ := serverEv(end); se.Status != omni.StatusCompleted {
		t.Fatalf("second task ended %q:%s", se.Status, describe(s2.got))
	}
	totals := requestTotals(t, followBus(t, js, sid, []string{omni.ClassEvent, omni.ClassServer}, untilIdle(task2)))
	if len(totals) != 2 {
		t.Fatalf("token_usage request totals %v, want one per Task", totals)
	}
	if grew, least := totals[1]-totals[0], int64(len(answer)/4); grew < least {
		t.Fatalf("the second request's context is %d tokens larger than the first's, want at least %d (the first answer)", grew, least)
	}
	p.stop()
}

func toBytes(r []json.RawMessage) [][]byte {
	out := make([][]byte, len(r))
	for i, b := range r {
		out[i] = b
	}
	return out
}

// `floe attach <sid>` against a running serve while a Task runs: it
// renders the answer streamed after it attached and exits 0 when the Task
// completes.
func TestAttachRendersLiveAnswer(t *testing.T) {
	live := "The live answer arrives in pieces after the approval."
	file := filepath.Join(t.TempDir(), "attach.json")
	writeJSON(t, file, obj{"requests": []any{
		obj{"steps": []any{obj{"tool_call": obj{"name": "exec_command", "id": "call_g",
			"arguments": obj{"description": "gate", "cmd": "echo gate"}}}}},
		obj{"steps": []any{obj{"text": live, "chunks": 8, "delay_ms": 20}}},
	}})
	h := newServeHome(t, "scripted:"+file)
	p := h.serve()
	c := client.New(h.url())
	sid := createSession(t, c, client.CreateSession{Workspace: h.dir, ApprovalMode: omni.ApproveAlwaysAsk})
	s := stream(t, c, sid, "")
	task := submit(t, c, sid, "answer after the gate")
	// The Task waits on the approval: it is surely running when attach
	// connects, and the answer comes only after attach is there.
	s.until("the approval request", approvalFor("call_g"))

	a := h.start("attach", sid, "--url", h.url())
	eventually(t, "attach to connect its stream", func() bool { return sseClients(t, h.url()) >= 2 })
	if err := c.Approve(ctxT(t), sid, "call_g", omni.DecisionAllow); err != nil {
		t.Fatal(err)
	}
	s.until("the task's end", idleOf(task))
	if code := a.wait(); code != 0 {
		t.Fatalf("floe attach exited %d\nstdout:\n%s\nstderr:\n%s", code, a.out.String(), a.errs.String())
	}
	if out := a.out.String(); !strings.Contains(out, live) {
		t.Fatalf("floe attach did not render the live answer %q:\n%s\nstderr:\n%s", live, out, a.errs.String())
	}
	// Attached to an idle Session, it renders the history and exits 0.
	a = h.start("attach", sid, "--url", h.url())
	if code := a.wait(); code != 0 || !strings.Contains(a.out.String(), live) {
		t.Fatalf("floe attach on an idle Session exited %d\nstdout:\n%s\nstderr:\n%s", code, a.out.String(), a.errs.String())
	}
	p.stop()
}

var sseClientsRE = regexp.MustCompile(`(?m)^floe_gateway_sse_clients (\d+)$`)

// sseClients reads the gateway's open SSE connections from /metrics.
func sseClients(t *testing.T, url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := sseClientsRE.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return -1
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// requestTotals returns the request totals of the token_usage events.
func requestTotals(t *testing.T, msgs []bus.StreamMsg) []int64 {
	t.Helper()
	var out []int64
	for _, sm := range msgs {
		if sm.Class != omni.ClassEvent {
			continue
		}
		m, err := omni.Decode(sm.Data)
		if err != nil {
			t.Fatal(err)
		}
		if m.Payload.Type == omni.TypeTokenUsage && m.Payload.Request != nil {
			out = append(out, m.Payload.Request.Total)
		}
	}
	return out
}

// `floe serve` whose gateway cannot listen (its port is taken) exits
// non-zero saying why, instead of running on without an API.
func TestServeExitsWhenGatewayCannotListen(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	h := newServeHome(t, "scripted:demo")
	h.httpAddr = taken.Addr().String()
	p := h.start("serve")
	if code := p.wait(); code == 0 {
		t.Fatalf("floe serve exited 0 with its HTTP port taken\nstderr:\n%s", p.errs.String())
	}
	if errs := p.errs.String(); !strings.Contains(errs, "already in use") || !strings.Contains(errs, h.httpAddr) {
		t.Fatalf("floe serve's error does not say why (the address and that it is in use):\n%s", errs)
	}
}

// `floe serve` stopped with SIGTERM in the middle of an answer: the engine
// hands the Task back, the restarted serve resumes it (the dead request
// closed as failed, then retried) and completes it, and the SSE client
// resumes with its Last-Event-ID: no gap, no duplicate.
func TestServeRestartMidTaskResumesIt(t *testing.T) {
	answer := longText("w", 80)
	file := filepath.Join(t.TempDir(), "slow.json")
	writeJSON(t, file, obj{"requests": []any{
		obj{"steps": []any{obj{"text": answer, "chunks": 80, "delay_ms": 30}}},
	}, "after_last": "repeat_last"})
	h := newServeHome(t, "scripted:"+file)
	// The engine Naks the Task when it stops, but the embedded server
	// stops too and its redelivery queue is not persisted: after the
	// restart the Task is ack-pending and comes back when AckWait expires
	// (30 s by default). A short AckWait keeps the test quick.
	h.extraEnv = []string{"FLOE_ENGINE_ACK_WAIT_MS=1500"}
	p := h.serve()
	c := client.New(h.url())
	sid := createSession(t, c, client.CreateSession{Workspace: h.dir})
	s0 := stream(t, c, sid, "")
	task := submit(t, c, sid, "go")
	s0.until("10 text fragments", func(client.Event) bool { return count(s0.got, isTextPartial) >= 10 })
	last := s0.lastID()
	p.stop()
	if s, err := client.New(h.url()).GetSession(ctxT(t), sid); err == nil {
		t.Fatalf("the stopped serve still answers: %+v", s)
	}

	p = h.serve()
	s1 := stream(t, c, sid, last)
	end := s1.until("the task's end", idleOf(task))
	if se, _ := serverEv(end); se.Status != omni.StatusCompleted {
		t.Fatalf("resumed task ended %q:%s", se.Status, describe(s1.got))
	}
	all := append(append([]client.Event(nil), s0.got...), s1.got...)
	sameAsBus(t, all, followBus(t, h.jsOf(), sid, omni.ClientClasses, untilIdle(task)))
	var ends []string
	final := ""
	for _, ev := range all {
		if m, ok := msgOf(ev); ok {
			switch {
			case m.Payload.Type == omni.TypeRequestEnd:
				ends = append(ends, m.Payload.Status)
			case m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleAssistant:
				final = m.Payload.Text
			}
		}
	}
	if !slices.Equal(ends, []string{omni.StatusFailed, omni.StatusCompleted}) {
		t.Fatalf("request_end statuses %v, want the interrupted request failed, then the retry completed:%s", ends, describe(all))
	}
	if final != answer {
		t.Fatalf("final answer %q, want %q", final, answer)
	}
	p.stop()
}
