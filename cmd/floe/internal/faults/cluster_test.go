package faults

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
)

// users are the NATS users of deploy/nats/auth.conf; each service runs as
// the user of its name.
var users = []string{"admin", "engine", "toolrunner", "tracer", "gateway", "ops", "hook"}

// cluster is one test's NATS node(s), Floe processes, shared FLOE_HOME and
// Workspace, and an admin connection for setting up and reading back.
type cluster struct {
	t         *testing.T
	dir       string // logs, configs, per-process HOMEs
	home      string // FLOE_HOME shared by every Floe process (one machine)
	ws        string // the Workspace of the test's Sessions
	nodes     []*node
	passwords map[string]string
	procs     procs // Floe processes, stopped before the nodes
	nodeProcs procs

	nc       *nats.Conn
	js       jetstream.JetStream
	sessions *bus.Sessions

	// links[{from, to}] carries from's route to to (newCutLinksCluster);
	// nil: the nodes route to each other directly.
	links map[[2]*node]*bustest.Link
}

// node is one nats-server.
type node struct {
	name                   string
	client, route, monitor int
	proc                   *proc
	storeDir, conf         string
}

func (n *node) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.client) }

var seq atomic.Int64

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newCluster starts n nats-server nodes (a JetStream cluster when n > 1)
// with deploy/nats/auth.conf, runs `floe setup` as admin with the given
// replicas and connects as admin.
//
// setupEnv is extra environment for `floe setup`, which owns the layout's
// settings (FLOE_ENGINE_ACK_WAIT_MS: the task consumer's ack wait).
func newCluster(t *testing.T, n, replicas int, setupEnv ...string) *cluster {
	t.Helper()
	return startCluster(t, n, replicas, false, setupEnv)
}

// newCutLinksCluster is newCluster with three nodes, everything
// replicated three times, whose routes each go through a bustest.Link of
// their own: isolate cuts a node off from its peers (its clients stay on
// it, served what it had: a lagging replica) and rejoin brings it back.
func newCutLinksCluster(t *testing.T, setupEnv ...string) *cluster {
	t.Helper()
	return startCluster(t, 3, 3, true, setupEnv)
}

func startCluster(t *testing.T, n, replicas int, cutLinks bool, setupEnv []string) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{t: t, dir: dir, home: filepath.Join(dir, "floe-home"), ws: filepath.Join(dir, "ws"),
		passwords: map[string]string{}}
	for _, d := range []string{c.home, c.ws, filepath.Join(dir, "nats")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range users {
		c.passwords[u] = randHex(12)
	}
	auth, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "nats", "auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nats", "auth.conf"), auth, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		c.nodes = append(c.nodes, &node{name: fmt.Sprintf("n%d", i+1), client: freePort(t), route: freePort(t), monitor: freePort(t)})
	}
	if cutLinks {
		c.links = map[[2]*node]*bustest.Link{}
		for _, from := range c.nodes {
			for _, to := range c.nodes {
				if from != to {
					c.links[[2]*node{from, to}] = bustest.NewLink(t, fmt.Sprintf("127.0.0.1:%d", to.route))
				}
			}
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.procs.dump(t)
			c.nodeProcs.dump(t)
		}
		c.procs.stopAll(5 * time.Second)
		if c.nc != nil {
			c.nc.Close()
		}
		c.nodeProcs.stopAll(5 * time.Second)
		if dir := os.Getenv("FAULTS_DUMP"); dir != "" {
			dir = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+time.Now().Format("150405"))
			c.procs.keepLogs(t, dir)
			c.nodeProcs.keepLogs(t, dir)
		}
	})
	for _, nd := range c.nodes {
		c.startNode(nd)
	}
	for _, nd := range c.nodes {
		c.waitNode(nd)
	}
	env := c.env("setup", append([]string{"FLOE_NATS_USER=admin", "FLOE_NATS_PASSWORD=" + c.passwords["admin"],
		"FLOE_REPLICAS=" + strconv.Itoa(replicas)}, setupEnv...)...)
	setup := c.start("setup", bins.floe, env, "setup", "--wait", "90s")
	if !setup.wait(100 * time.Second) {
		t.Fatalf("floe setup did not finish:\n%s", setup.tail(20))
	}
	if setup.err != nil {
		t.Fatalf("floe setup: %v\n%s", setup.err, setup.tail(20))
	}
	c.nc, err = nats.Connect(c.url(), nats.UserInfo("admin", c.passwords["admin"]), nats.Name("faults-admin"),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if c.js, err = jetstream.New(c.nc); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c.sessions, err = bus.Open(ctx, c.js); err != nil {
		t.Fatal(err)
	}
	return c
}

// url is the comma-separated client URLs of every node.
func (c *cluster) url() string {
	var urls []string
	for _, nd := range c.nodes {
		urls = append(urls, nd.url())
	}
	return strings.Join(urls, ",")
}

// env is the environment of a process: no inherited Floe or NATS settings,
// HOME in its own empty directory (so `bash -lc` loads no profile of this
// machine), the shared FLOE_HOME, then extra.
func (c *cluster) env(name string, extra ...string) []string {
	home := filepath.Join(c.dir, "home-"+name)
	if err := os.MkdirAll(home, 0o755); err != nil {
		c.t.Fatal(err)
	}
	env := append(baseEnv(), "HOME="+home, "FLOE_HOME="+c.home, "FLOE_NATS_URL="+c.url(), "FLOE_LOG_LEVEL=info",
		"FLOE_WORKSPACE_ROOTS="+c.ws, "FLOE_SCRIPTS_DIR="+c.dir) // the gateway's: c.script writes into c.dir
	return append(env, extra...)
}

func (c *cluster) start(name, bin string, env []string, args ...string) *proc {
	c.t.Helper()
	p := startProc(c.t, c.dir, name, bin, env, args...)
	c.procs.add(p)
	return p
}

func (c *cluster) startNode(nd *node) {
	c.t.Helper()
	nd.storeDir = filepath.Join(c.dir, "nats", nd.name)
	var routes []string
	for _, o := range c.nodes {
		switch {
		case o == nd:
		case c.links != nil:
			routes = append(routes, "nats-route://"+c.links[[2]*node{nd, o}].Addr())
		default:
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.route))
		}
	}
	// Through links, a node advertises a port nothing listens on, so its
	// peers cannot route around a cut link to its real address.
	advertise := ""
	if c.links != nil {
		advertise = "  advertise: \"127.0.0.1:1\"\n"
	}
	conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
max_payload: 8MB
jetstream {
  store_dir: %q
  max_memory_store: 256MB
  max_file_store: 2GB
}
`, nd.name, nd.client, nd.monitor, nd.storeDir)
	if len(c.nodes) > 1 {
		conf += fmt.Sprintf(`cluster {
  name: floe
  listen: 127.0.0.1:%d
%s  routes: [%s]
}
`, nd.route, advertise, strings.Join(routes, ", "))
	}
	conf += "include ./auth.conf\n"
	nd.conf = filepath.Join(c.dir, "nats", nd.name+".conf")
	if err := os.WriteFile(nd.conf, []byte(conf), 0o644); err != nil {
		c.t.Fatal(err)
	}
	env := append(baseEnv(), "HOME="+c.dir)
	for _, u := range users {
		env = append(env, "FLOE_"+strings.ToUpper(u)+"_PASSWORD="+c.passwords[u])
	}
	nd.proc = startProc(c.t, c.dir, "nats-"+nd.name, bins.natsServer, env, "-c", nd.conf)
	c.nodeProcs.add(nd.proc)
}

// waitNode waits until the node's monitoring endpoint says it is healthy
// (in a cluster: JetStream is up and has a meta leader).
func (c *cluster) waitNode(nd *node) {
	c.t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	eventually(c.t, 60*time.Second, "nats node "+nd.name+" healthy", func() bool {
		if nd.proc.exited() {
			c.t.Fatalf("nats %s exited: %v\n%s", nd.name, nd.proc.err, nd.proc.tail(30))
		}
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", nd.monitor))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// service starts `floe <kind>` as the NATS user <kind>, without setting up
// the layout (the service users may not), and waits until it is ready.
func (c *cluster) service(kind, name string, extra ...string) *proc {
	c.t.Helper()
	return c.serviceBin(bins.floe, []string{kind}, kind, name, extra...)
}

// serviceBin is service with another binary and arguments (the per-service
// mains).
func (c *cluster) serviceBin(bin string, args []string, kind, name string, extra ...string) *proc {
	c.t.Helper()
	env := c.env(name, "FLOE_NATS_USER="+kind, "FLOE_NATS_PASSWORD="+c.passwords[kind], "FLOE_SETUP=false")
	p := c.start(name, bin, append(env, extra...), args...)
	switch kind {
	case "engine":
		p.waitLog(c.t, `"engine started"`, 60*time.Second)
	case "toolrunner":
		p.waitLog(c.t, `"toolrunner started"`, 60*time.Second)
	case "gateway":
		p.waitLog(c.t, `"gateway listening"`, 60*time.Second)
	case "tracer":
		c.waitConsumer(omni.SessionsStream, "floe-tracer")
	}
	return p
}

// waitConsumer waits until a durable consumer exists.
func (c *cluster) waitConsumer(stream, name string) {
	c.t.Helper()
	eventually(c.t, 60*time.Second, "consumer "+name, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.js.Consumer(ctx, stream, name)
		return err == nil
	})
}

// violations returns the permission violations the nats nodes logged.
func (c *cluster) violations() []string {
	var out []string
	for _, nd := range c.nodes {
		for _, l := range strings.Split(nd.proc.log(), "\n") {
			if strings.Contains(l, "Violation") {
				out = append(out, l)
			}
		}
	}
	return out
}

// noViolations fails the test if a node logged a permission violation:
// every service must work within its permission set.
func (c *cluster) noViolations() {
	c.t.Helper()
	if v := c.violations(); len(v) > 0 {
		c.t.Errorf("permission violations:\n%s", strings.Join(v, "\n"))
	}
}

// script writes a scripted model file and returns its model reference.
func (c *cluster) script(v any) string {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	p := filepath.Join(c.dir, fmt.Sprintf("script-%d.json", seq.Add(1)))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		c.t.Fatal(err)
	}
	return "scripted:" + p
}

// session creates a Session record working in the test's Workspace.
func (c *cluster) session(modelRef string) string {
	c.t.Helper()
	now := time.Now().UTC()
	sid := omni.NewSessionID(now, fmt.Sprintf("%08x", uint32(seq.Add(1))<<8|uint32(randByte())))
	rec := &omni.SessionRecord{ID: sid, Model: modelRef, Workspace: c.ws, ApprovalMode: omni.ApproveAllowAll,
		State: omni.StateIdle, CreatedUnixMs: now.UnixMilli()}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.sessions.Create(ctx, rec); err != nil {
		c.t.Fatal(err)
	}
	return sid
}

func randByte() byte {
	var b [1]byte
	_, _ = rand.Read(b[:])
	return b[0]
}

// submit starts a Task as the gateway does and returns its id.
func (c *cluster) submit(sid, prompt string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := fmt.Sprintf("task-%d-%s", seq.Add(1), randHex(3))
	for {
		// A record just created may not have reached the replica that
		// serves this read (direct gets are served by any replica).
		_, err := c.sessions.Begin(ctx, sid, omni.StateRunning, id)
		if err == nil {
			break
		}
		if !errors.Is(err, bus.ErrSessionNotFound) || ctx.Err() != nil {
			c.t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	nm, err := bus.PackMsg(omni.TaskSubject(sid), &omni.Task{ID: id, Kind: omni.TaskRun, SessionID: sid,
		Input: []omni.InputPart{{Type: "text", Text: prompt}}})
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.js.PublishMsg(ctx, nm); err != nil {
		c.t.Fatal(err)
	}
	return id
}

// rec is one message of a Session's stream.
type rec struct {
	seq   uint64
	class string
	raw   []byte
	msg   omni.Message     // OmniMessage classes
	ev    omni.ServerEvent // server class
}

func (r rec) isEvent(typ string) bool {
	return r.class != omni.ClassServer && r.msg.Type == omni.KindEvent && r.msg.Payload.Type == typ
}

func (r rec) isModel(typ string) bool {
	return r.class != omni.ClassServer && r.msg.Type == omni.KindModel && r.msg.Payload.Type == typ
}

// wait follows the Session's stream until Task taskID goes idle and
// returns every message up to then and the Task's status. onMsg, when
// set, sees each message as it arrives.
func (c *cluster) wait(sid, taskID string, d time.Duration, onMsg func(rec)) ([]rec, string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []rec
	status := ""
	err := bus.FollowUntil(ctx, c.js, sid, nil, 0, false, func(sm bus.StreamMsg) error {
		r := decodeRec(c.t, sm)
		out = append(out, r)
		if onMsg != nil {
			onMsg(r)
		}
		if r.class == omni.ClassServer && r.ev.Type == omni.ServerTaskState && r.ev.State == omni.StateIdle && r.ev.TaskID == taskID {
			status = r.ev.Status
			return bus.ErrStop
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("waiting for task %s of %s: %v (got %d messages; last: %v)", taskID, sid, err, len(out), lastLabels(out, 8))
	}
	return out, status
}

func decodeRec(t testing.TB, sm bus.StreamMsg) rec {
	r := rec{seq: sm.Seq, class: sm.Class, raw: append([]byte(nil), sm.Data...)}
	if sm.Class == omni.ClassServer {
		if err := json.Unmarshal(sm.Data, &r.ev); err != nil {
			t.Errorf("bad server event at %d: %v: %s", sm.Seq, err, sm.Data)
		}
		return r
	}
	m, err := omni.Decode(sm.Data)
	if err != nil {
		t.Errorf("undecodable message at %d: %v: %s", sm.Seq, err, sm.Data)
	}
	r.msg = m
	return r
}

// all reads everything stored for a Session.
func (c *cluster) all(sid string, classes []string) []rec {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out []rec
	var err error
	// After a node loss a fresh ordered consumer may stay silent until its
	// heartbeats are missed: read again with a new one.
	for attempt := 0; attempt < 4; attempt++ {
		out = out[:0]
		actx, acancel := context.WithTimeout(ctx, 20*time.Second)
		err = bus.Follow(actx, c.js, sid, classes, 0, true, func(sm bus.StreamMsg) error {
			out = append(out, decodeRec(c.t, sm))
			return nil
		})
		acancel()
		if err == nil {
			return out
		}
	}
	c.t.Fatalf("read %s: %v", sid, err)
	return nil
}

// label names a message compactly, e.g. "request_end:failed",
// "tool_call_output:call_a", "server:task_state:idle".
func label(r rec) string {
	if r.class == omni.ClassServer {
		return "server:" + r.ev.Type + ":" + r.ev.State
	}
	if r.msg.Type == omni.KindSessionMeta {
		return "session_meta"
	}
	p := &r.msg.Payload
	s := p.Type
	for _, x := range []string{p.EventType, p.Status, p.ToolCallID} {
		if x != "" {
			s += ":" + x
		}
	}
	return s
}

func lastLabels(rs []rec, n int) []string {
	if len(rs) > n {
		rs = rs[len(rs)-n:]
	}
	var out []string
	for _, r := range rs {
		out = append(out, label(r))
	}
	return out
}

// outcome of checkSession.
type outcome struct {
	calls    []string       // tool_call ids in stream order
	outputs  map[string]rec // the one complete output of each call
	dangling int            // partial segments a dead producer left open
	aborted  []string       // calls an abort stopped (aborted output) or caught before they ran (none)
	requests int            // request_begin count
}

// checkSession asserts that nothing was lost or duplicated in a Session's
// stream and that pairing is intact:
//   - one session_meta; each prompt exactly once as a user text;
//   - every tool_call id once, with exactly one approval_decision before
//     exactly one complete tool_call_output after it (an aborted one,
//     before the abort, for a call the abort stopped; none for a call it
//     caught before it ran), no output without a call;
//   - request_begin and request_end alternate (an interrupted request is
//     closed by the engine that takes over before the next begins) and the
//     stream does not end inside a request;
//   - per producer, partial segments run start → delta* → stop → complete
//     with the concatenated content; a segment a dead producer left open is
//     counted as dangling when its request (or call) is closed as failed;
//   - the last server event is task_state idle.
func checkSession(t *testing.T, rs []rec, prompts ...string) outcome {
	t.Helper()
	o := outcome{outputs: map[string]rec{}}
	metas := 0
	userTexts := map[string]int{}
	decisions := map[string]int{}
	called := map[string]int{}
	callSeq := map[string]uint64{}
	var lastAbort uint64
	inRequest := false
	type seg struct {
		key     string
		content strings.Builder
		stopped bool
	}
	open := map[string]*seg{}
	for _, r := range rs {
		if r.class == omni.ClassServer {
			continue
		}
		m := &r.msg
		p := &m.Payload
		if len(m.Origin) > 0 {
			continue // a child Session's message, checked on its own stream
		}
		switch {
		case m.Type == omni.KindSessionMeta:
			metas++
		case r.isEvent(omni.TypeRequestBegin):
			if inRequest {
				t.Errorf("seq %d: request_begin inside an open request", r.seq)
			}
			inRequest = true
			o.requests++
		case r.isEvent(omni.TypeRequestEnd):
			if !inRequest {
				t.Errorf("seq %d: request_end without request_begin", r.seq)
			}
			inRequest = false
			if p.Status != omni.StatusCompleted {
				// A failed request may leave the model's segment open (its
				// producer died mid-stream); nothing of it continues.
				if s := open["model"]; s != nil && !s.stopped {
					o.dangling++
					delete(open, "model")
				}
			}
		case r.isEvent(omni.TypeApprovalDecision):
			decisions[p.ToolCallID]++
			if called[p.ToolCallID] == 0 {
				t.Errorf("seq %d: approval_decision for unknown call %s", r.seq, p.ToolCallID)
			}
			if _, ok := o.outputs[p.ToolCallID]; ok {
				t.Errorf("seq %d: approval_decision for %s after its output", r.seq, p.ToolCallID)
			}
		case r.isModel(omni.TypeText) && p.Role == omni.RoleUser:
			userTexts[p.Text]++
		case r.isModel(omni.TypeToolCall):
			called[p.ToolCallID]++
			if called[p.ToolCallID] > 1 {
				t.Errorf("seq %d: tool_call %s appears twice", r.seq, p.ToolCallID)
			}
			o.calls = append(o.calls, p.ToolCallID)
			callSeq[p.ToolCallID] = r.seq
		case r.isEvent(omni.TypeAbort):
			lastAbort = r.seq
		case r.isModel(omni.TypeToolCallOutput):
			if called[p.ToolCallID] == 0 {
				t.Errorf("seq %d: output for unknown call %s", r.seq, p.ToolCallID)
			}
			if prev, ok := o.outputs[p.ToolCallID]; ok {
				t.Errorf("seq %d: second output for %s (first at %d)", r.seq, p.ToolCallID, prev.seq)
			}
			o.outputs[p.ToolCallID] = r
		}

		// Segment discipline per producer: the engine's model stream, or
		// one tool call's output.
		if m.Type != omni.KindModel || (p.Role == omni.RoleUser && p.Type == omni.TypeText) || p.Type == omni.TypeImageURL {
			continue
		}
		prod := "model"
		if p.Type == omni.TypePartialToolCallOutput || p.Type == omni.TypeToolCallOutput {
			prod = "out:" + p.ToolCallID
		}
		k := omni.CompleteType(p.Type)
		if k == "" {
			k = p.Type
		}
		k += "|" + p.ToolCallID
		s := open[prod]
		if m.IsPartial() {
			switch p.EventType {
			case omni.EventStart:
				if s != nil {
					t.Errorf("seq %d: %s starts while %s is open", r.seq, k, s.key)
				}
				s = &seg{key: k}
				open[prod] = s
			default:
				if s == nil || s.key != k || s.stopped {
					t.Errorf("seq %d: %s %s without an open segment", r.seq, k, p.EventType)
					continue
				}
			}
			s.content.WriteString(p.Content())
			if p.EventType == omni.EventStop {
				s.stopped = true
			}
			continue
		}
		if s == nil && p.Type == omni.TypeToolCallOutput {
			continue // synthetic output (lost runner, denial) has no segment
		}
		if s != nil && !s.stopped && p.Type == omni.TypeToolCallOutput && p.StopReason == omni.StatusFailed {
			o.dangling++ // the runner died mid-output; the engine closed the call
			delete(open, prod)
			continue
		}
		if s == nil || !s.stopped || s.key != k {
			t.Errorf("seq %d: complete %s not right after its segment's stop", r.seq, k)
			continue
		}
		if got, want := s.content.String(), p.Content(); got != want {
			t.Errorf("seq %d: deltas of %s concatenate to %q, complete says %q", r.seq, k, got, want)
		}
		delete(open, prod)
	}
	if metas != 1 {
		t.Errorf("%d session_meta, want 1", metas)
	}
	for _, pr := range prompts {
		if userTexts[pr] != 1 {
			t.Errorf("prompt %q appears %d times, want once", pr, userTexts[pr])
		}
	}
	for _, id := range o.calls {
		if decisions[id] != 1 {
			t.Errorf("call %s has %d approval_decisions, want 1", id, decisions[id])
		}
		out, ok := o.outputs[id]
		switch {
		case ok && out.msg.Payload.StopReason == omni.StatusAborted && strings.Contains(out.msg.Payload.Output, omni.InterruptedOutput):
			// Case A: a running call stopped by the abort has its
			// aborted output before the abort.
			if lastAbort < out.seq {
				t.Errorf("call %s's aborted output comes after the abort", id)
			}
			o.aborted = append(o.aborted, id)
		case ok:
		case lastAbort > callSeq[id]:
			// A call the abort caught before it ran has no output: the
			// model sees it as interrupted (the fold adds the fixed text).
			o.aborted = append(o.aborted, id)
		default:
			t.Errorf("call %s has no output", id)
		}
	}
	if inRequest {
		t.Errorf("the stream ends inside a request")
	}
	for prod, s := range open {
		t.Errorf("segment %s of %s never completed", s.key, prod)
	}
	var last *rec
	for i := range rs {
		if rs[i].class == omni.ClassServer {
			last = &rs[i]
		}
	}
	if last == nil || last.ev.Type != omni.ServerTaskState || last.ev.State != omni.StateIdle {
		t.Errorf("the last server event is not task_state idle: %v", last)
	}
	return o
}

// traceEqualsStream waits until the tracer has written everything of the
// Session stored so far and checks that its Trace files hold exactly the
// stream's Trace classes, in order, byte for byte, nothing missing and
// nothing twice.
func (c *cluster) traceEqualsStream(sid string) {
	c.t.Helper()
	var want [][]byte
	var last uint64
	for _, r := range c.all(sid, omni.TraceClasses) {
		last = r.seq
		if len(r.msg.Origin) == 0 && !r.msg.IsPartial() {
			want = append(want, r.raw)
		}
	}
	c.waitTracer(sid, last)
	files, err := trace.Files(c.home, sid)
	if err != nil || len(files) == 0 {
		c.t.Fatalf("trace files of %s: %v %v", sid, files, err)
	}
	var got [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			c.t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			got = append(got, []byte(l))
		}
	}
	if len(got) != len(want) {
		c.t.Fatalf("trace has %d records, stream %d", len(got), len(want))
	}
	for i := range got {
		if string(got[i]) != string(want[i]) {
			c.t.Fatalf("trace record %d differs:\ntrace  %s\nstream %s", i, got[i], want[i])
		}
	}
}

// tracerWait bounds how long the tracer may take to write what the stream
// holds. After a leader failover it resets its consumer to the ack floor
// (a fetch that ended with an error may have lost deliveries) and
// redelivers from there, at once when its fetches deliver: in the failover
// loops the Traces were written within 0.3 s of the last Session going
// idle (it took up to minutes while every reset backed off).
const tracerWait = 60 * time.Second

// waitTracer waits until the tracer's position of sid reaches seq.
func (c *cluster) waitTracer(sid string, seq uint64) {
	c.t.Helper()
	eventually(c.t, tracerWait, "the tracer to reach seq "+strconv.FormatUint(seq, 10)+" of "+sid, func() bool {
		p, ok, err := trace.ReadPos(c.home, sid)
		return err == nil && ok && p.Seq >= seq
	})
}

// tracerCaughtUp waits until the tracer has written every Trace record
// the stream holds now of each Session.
func (c *cluster) tracerCaughtUp(sids ...string) {
	c.t.Helper()
	for _, sid := range sids {
		var last uint64
		for _, r := range c.all(sid, omni.TraceClasses) {
			last = r.seq
		}
		c.waitTracer(sid, last)
	}
}

// record returns the Session record.
func (c *cluster) record(sid string) *omni.SessionRecord {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, _, err := c.sessions.Get(ctx, sid)
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

// checkIdle asserts the Session record ended idle with status.
func (c *cluster) checkIdle(sid, status string) {
	c.t.Helper()
	r := c.record(sid)
	if r.State != omni.StateIdle || r.TaskID != "" || r.LastStatus != status {
		c.t.Errorf("session record: state %q task %q last status %q, want idle, no task, %q", r.State, r.TaskID, r.LastStatus, status)
	}
}

// execCall is a scripted exec_command call.
func execCall(id, cmd string) map[string]any {
	return map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": id,
		"arguments": map[string]any{"description": "step " + id, "cmd": cmd}}}
}

func text(s string, chunks, delayMs int) map[string]any {
	return map[string]any{"text": s, "chunks": chunks, "delay_ms": delayMs}
}

// logCmd appends "<session> <tool call>" to calls.log in the Workspace: one
// line per execution of a tool call.
const logCmd = `echo "$FLOE_SESSION_ID $FLOE_TOOL_CALL_ID" >> calls.log`

// executions counts the lines calls.log has for (sid, id).
func (c *cluster) executions(sid, id string) int {
	b, err := os.ReadFile(filepath.Join(c.ws, "calls.log"))
	if err != nil && !os.IsNotExist(err) {
		c.t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if l == sid+" "+id {
			n++
		}
	}
	return n
}

// heartbeats records which runner reported which call of a Session.
type heartbeats struct {
	ch chan omni.Heartbeat
}

func (c *cluster) watchHeartbeats(sid string) *heartbeats {
	c.t.Helper()
	hb := &heartbeats{ch: make(chan omni.Heartbeat, 4096)}
	sub, err := c.nc.Subscribe(omni.HeartbeatSubject(sid), func(m *nats.Msg) {
		var b omni.Heartbeat
		if omni.Unpack(m.Data, &b) == nil {
			select {
			case hb.ch <- b:
			default:
			}
		}
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := c.nc.Flush(); err != nil {
		c.t.Fatal(err)
	}
	return hb
}

// runnerPid returns the pid in a default runner id (<host>-<pid>-<hex>).
func runnerPid(id string) int {
	parts := strings.Split(id, "-")
	if len(parts) < 3 {
		return 0
	}
	n, _ := strconv.Atoi(parts[len(parts)-2])
	return n
}

// follow delivers a Session's messages, stored then live, to fn until it
// returns true or d passes, and reports whether it returned true. It never
// fails the test itself, so it may run on another goroutine.
func (c *cluster) follow(sid string, d time.Duration, fn func(rec) bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ok := false
	_ = bus.FollowUntil(ctx, c.js, sid, nil, 0, false, func(sm bus.StreamMsg) error {
		if fn(decodeRec(c.t, sm)) {
			ok = true
			return bus.ErrStop
		}
		return nil
	})
	return ok
}

// isolate cuts nd's routes (newCutLinksCluster): its peers see it as if
// killed, while it keeps serving the clients connected to it with what it
// had.
func (c *cluster) isolate(nd *node) {
	for _, o := range c.nodes {
		if o != nd {
			c.links[[2]*node{nd, o}].Cut()
			c.links[[2]*node{o, nd}].Cut()
		}
	}
}

// rejoin restores nd's routes: it catches up with its peers.
func (c *cluster) rejoin(nd *node) {
	for _, o := range c.nodes {
		if o != nd {
			c.links[[2]*node{nd, o}].Restore()
			c.links[[2]*node{o, nd}].Restore()
		}
	}
}
