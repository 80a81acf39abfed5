package toolrunner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/toolrunner"
)

func TestJobStreamsPartialsThenOneCompleteOutput(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.start(toolrunner.Config{})
	tests := []struct {
		name, cmd string
		want      string
		failed    bool
		minChunks int // fragments with content: > 1 proves output streamed before the end
	}{
		{name: "streamed", cmd: "printf 'hello\\n'; sleep 0.3; printf 'world\\n'", want: "hello\nworld\n", minChunks: 2},
		{name: "no output", cmd: "true", want: omni.NoOutput, minChunks: 1},
		{name: "failed command", cmd: "echo oops; exit 3", want: "oops\n[exit code: 3]", failed: true, minChunks: 1},
		{name: "session and call in env", cmd: `echo "$FLOE_SESSION_ID $FLOE_TOOL_CALL_ID"`, want: "s-3 c-3\n", minChunks: 1},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sid, id := fmt.Sprintf("s-%d", i), fmt.Sprintf("c-%d", i)
			h := *h
			h.t = t
			h.enqueue(h.execJob(sid, id, tt.cmd))
			msgs := h.waitOutput(sid, id)
			p := h.checkSegment(sid, msgs)
			wantStop := omni.StatusCompleted
			if tt.failed {
				wantStop = omni.StatusFailed
			}
			if p.Output != tt.want || p.StopReason != wantStop {
				t.Errorf("complete output = %q stop_reason %q, want %q stop_reason %q", p.Output, p.StopReason, tt.want, wantStop)
			}
			chunks := 0
			for _, m := range msgs {
				if m.msg.IsPartial() && m.msg.Payload.Content() != "" {
					chunks++
				}
			}
			if chunks < tt.minChunks {
				t.Errorf("%d fragments with content, want at least %d: %v", chunks, tt.minChunks, types(msgs))
			}
		})
	}
}

func TestChattyOutputIsCoalesced(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.start(toolrunner.Config{})
	// 3000 separate writes, about 14 KB.
	h.enqueue(h.execJob("s1", "c1", "for i in $(seq 1 3000); do echo $i; done"))
	msgs := h.waitOutput("s1", "c1")
	p := h.checkSegment("s1", msgs)
	if !strings.HasPrefix(p.Output, "1\n2\n3\n") || !strings.HasSuffix(p.Output, "2999\n3000\n") {
		t.Errorf("output = %.40q…, want the numbers 1 to 3000", p.Output)
	}
	if len(msgs) > 300 {
		t.Errorf("%d messages for 3000 writes; want them coalesced", len(msgs))
	}
}

func TestReplicasRunEveryJobExactlyOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	hb := h.watchHeartbeats("*")
	const jobs, sessions = 60, 4
	logFile := filepath.Join(h.ws, "ran.log")
	for i := range jobs {
		h.enqueue(h.execJob(fmt.Sprintf("s%d", i%sessions), fmt.Sprintf("c%02d", i),
			`echo "$FLOE_TOOL_CALL_ID" >> ran.log; sleep 0.1; echo done`))
	}
	runners := []string{"r0", "r1", "r2"}
	for _, id := range runners {
		h.start(toolrunner.Config{RunnerID: id, Concurrency: 3})
	}

	outputs := map[string][]streamed{}
	// 60 confined commands (each a sandbox start, protocol.md §7) on 9 slots.
	bustest.Eventually(t, 3*wait, "every job's complete output", func() bool {
		outputs = map[string][]streamed{}
		n := 0
		for s := range sessions {
			for _, m := range completes(h.session(fmt.Sprintf("s%d", s))) {
				outputs[m.msg.Payload.ToolCallID] = append(outputs[m.msg.Payload.ToolCallID], m)
				n++
			}
		}
		return n >= jobs
	})
	ran, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	for line := range strings.Lines(string(ran)) {
		runs[strings.TrimSpace(line)]++
	}
	byRunner := map[string]int{}
	for i := range jobs {
		id := fmt.Sprintf("c%02d", i)
		if runs[id] != 1 {
			t.Errorf("%s executed %d times, want once", id, runs[id])
		}
		if len(outputs[id]) != 1 || outputs[id][0].msg.Payload.Output != "done\n" {
			t.Errorf("%s has complete outputs %v, want exactly one %q", id, outputs[id], "done\n")
		}
		who := map[string]bool{}
		for _, b := range hb.naming(id) {
			who[b.Runner] = true
		}
		if len(who) != 1 {
			t.Errorf("%s reported by runners %v, want exactly one", id, who)
		}
		for r := range who {
			byRunner[r]++
		}
	}
	for _, r := range runners {
		if byRunner[r] == 0 {
			t.Errorf("runner %s ran no job (spread %v)", r, byRunner)
		}
	}
	t.Logf("jobs per runner: %v", byRunner)
}

func TestHeartbeatsWhileJobRunsAndNotAfter(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	hb := h.watchHeartbeats("s1")
	r := h.start(toolrunner.Config{HeartbeatInterval: 20 * time.Millisecond})
	h.enqueue(h.execJob("s1", "short", "sleep 0.5"))
	h.enqueue(h.execJob("s1", "long", "sleep 30"))

	bustest.Eventually(t, wait, "heartbeats naming the short job", func() bool {
		return len(hb.naming("short")) >= 3
	})
	for _, b := range hb.all() {
		if b.Runner != r.id || b.sid != "s1" {
			t.Errorf("heartbeat %+v, want runner %s on s1", b, r.id)
		}
	}
	h.waitOutput("s1", "short")
	// The long job's heartbeats go on; once one omits the short job, none
	// after it may name it again.
	first := len(hb.all())
	bustest.Eventually(t, wait, "a heartbeat without the finished job", func() bool {
		all := hb.all()
		for i := first; i < len(all); i++ {
			b := all[i]
			if slices.Contains(b.ToolCallIDs, "long") && !slices.Contains(b.ToolCallIDs, "short") {
				first = i
				return true
			}
		}
		return false
	})
	bustest.Eventually(t, wait, "more heartbeats", func() bool { return len(hb.all()) >= first+5 })
	for _, b := range hb.all()[first:] {
		if slices.Contains(b.ToolCallIDs, "short") {
			t.Errorf("heartbeat %v names the finished job", b.ToolCallIDs)
		}
	}
}

// A cancelled job's process is stopped; its output segment closes with
// stop_reason aborted and, before the cancel reply, its one complete
// output holds what it printed and the interrupted marker (protocol.md §6 case
// A); nothing of the process comes after.
func TestCancelStopsRunningJobAndPublishesItsAbortedOutput(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.start(toolrunner.Config{Concurrency: 1})
	h.enqueue(h.execJob("s1", "x", "echo started; sleep 30; echo finished"))
	bustest.Eventually(t, wait, "the job's first output", func() bool {
		return len(of(h.session("s1"), "x")) > 0
	})
	began := time.Now()
	reply := h.cancel("s1", "x")
	if reply.Runner != r.id || !slices.Equal(reply.ToolCallIDs, []string{"x"}) {
		t.Errorf("cancel reply = %+v, want runner %s stopping [x]", reply, r.id)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("cancel took %v", d)
	}
	// The only slot frees when the cancelled job's goroutine is gone, so
	// once the next job has run the cancelled one can publish nothing more.
	// Stored before the reply: it is on the stream already.
	xs := of(h.session("s1"), "x")
	if n := len(completes(xs)); n != 1 {
		t.Fatalf("cancelled job has %d complete outputs on the stream at the reply, want 1", n)
	}
	h.enqueue(h.execJob("s1", "y", "echo after"))
	h.checkSegment("s1", h.waitOutput("s1", "y"))
	xs = of(h.session("s1"), "x")
	p := h.checkSegment("s1", xs)
	if want := "started\n" + omni.InterruptedOutput; p.Output != want || p.StopReason != omni.StatusAborted {
		t.Fatalf("aborted output = %q (%s), want %q (aborted)", p.Output, p.StopReason, want)
	}
	for _, m := range xs {
		if m.msg.IsPartial() && m.msg.Payload.EventType == omni.EventStop && m.msg.Payload.StopReason != omni.StatusAborted {
			t.Errorf("stop fragment stop_reason %q, want aborted", m.msg.Payload.StopReason)
		}
		if strings.Contains(m.msg.Payload.Content(), "finished") {
			t.Errorf("the stopped process went on: %q", m.msg.Payload.Content())
		}
	}
}

func TestCancelWithoutIDsStopsEveryJobOfTheSession(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	hb := h.watchHeartbeats("*")
	r := h.start(toolrunner.Config{Concurrency: 4, HeartbeatInterval: 20 * time.Millisecond})
	h.enqueue(h.execJob("s1", "a", "sleep 30"))
	h.enqueue(h.execJob("s1", "b", "sleep 30"))
	h.enqueue(h.execJob("s2", "c", "sleep 30"))
	bustest.Eventually(t, wait, "all three jobs running", func() bool {
		return len(hb.naming("a")) > 0 && len(hb.naming("b")) > 0 && len(hb.naming("c")) > 0
	})
	reply := h.cancel("s1")
	slices.Sort(reply.ToolCallIDs)
	if reply.Runner != r.id || !slices.Equal(reply.ToolCallIDs, []string{"a", "b"}) {
		t.Errorf("cancel reply = %+v, want runner %s stopping [a b]", reply, r.id)
	}
	n := len(hb.all())
	bustest.Eventually(t, wait, "the other Session's job still reported", func() bool {
		for _, b := range hb.all()[n:] {
			if b.sid == "s2" && slices.Contains(b.ToolCallIDs, "c") {
				return true
			}
		}
		return false
	})
	for _, b := range hb.all()[n:] {
		if b.sid == "s1" {
			t.Errorf("heartbeat %v for s1 after its jobs were cancelled", b.ToolCallIDs)
		}
	}
}

func TestJobCancelledBeforeFetchIsDropped(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	hb := h.watchHeartbeats("s1")
	r := h.start(toolrunner.Config{Concurrency: 1})
	h.enqueue(h.execJob("s1", "a", "sleep 30"))
	bustest.Eventually(t, wait, "job a running", func() bool { return len(hb.naming("a")) > 0 })
	h.enqueue(h.execJob("s1", "b", "touch b-ran"))
	// Cancel b while it waits in the queue; nobody replies (nothing stopped).
	m, err := bus.PackMsg(omni.CancelSubject("s1"), omni.Cancel{ToolCallIDs: []string{"b"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.env.Conn.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	// Same connection, so the runner handles b's cancel before a's.
	if reply := h.cancel("s1", "a"); !slices.Equal(reply.ToolCallIDs, []string{"a"}) {
		t.Errorf("cancel reply = %+v, want [a]", reply)
	}
	h.enqueue(h.execJob("s1", "c", "echo c"))
	h.checkSegment("s1", h.waitOutput("s1", "c")) // b came first off the queue

	if msgs := of(h.session("s1"), "b"); len(msgs) != 0 {
		t.Errorf("dropped job published %v", types(msgs))
	}
	if _, err := os.Stat(filepath.Join(h.ws, "b-ran")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dropped job ran: stat b-ran: %v", err)
	}
	if !strings.Contains(r.logs.String(), `"tool_call_id":"b"`) || !strings.Contains(r.logs.String(), "dropped without running") {
		t.Errorf("no log of the dropped job:\n%s", r.logs.String())
	}
	bustest.Eventually(t, wait, "an empty tool queue", func() bool {
		s, err := h.env.JS.Stream(context.Background(), omni.ToolsStream)
		return err == nil && s.CachedInfo().State.Msgs == 0
	})
}

func TestDuplicateCompleteOutputIsDropped(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.start(toolrunner.Config{})
	h.enqueue(h.execJob("s1", "c1", "echo once"))
	h.waitOutput("s1", "c1")

	// The engine declaring the job lost publishes with the same Msg-Id.
	m := omni.ToolCallOutput("c1", "outcome unknown", omni.StatusFailed)
	nm, err := bus.SessionMsg("s1", &m, bus.OutputMsgID("s1", "c1"))
	if err != nil {
		t.Fatal(err)
	}
	if ack := h.publish(nm); !ack.Duplicate {
		t.Errorf("second complete output stored as seq %d, want it dropped as a duplicate", ack.Sequence)
	}
	got := completes(of(h.session("s1"), "c1"))
	if len(got) != 1 || got[0].msg.Payload.Output != "once\n" {
		t.Errorf("complete outputs %v, want one %q", got, "once\n")
	}
}

func TestToolListServesBuiltinSpecs(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.start(toolrunner.Config{})
	var resp *nats.Msg
	bustest.Eventually(t, wait, "a tool list reply", func() bool {
		var err error
		resp, err = h.env.Conn.Request(toolrunner.ToolListSubject(omni.DefaultPool), nil, time.Second)
		return err == nil
	})
	if ct := resp.Header.Get(bus.HeaderContentType); ct != omni.ContentTypeMsgpack {
		t.Errorf("Content-Type = %q, want %q", ct, omni.ContentTypeMsgpack)
	}
	var list omni.ToolList
	if err := omni.Unpack(resp.Data, &list); err != nil {
		t.Fatal(err)
	}
	specs := list.Tools
	if list.Runner == "" || list.MCP != nil {
		t.Errorf("runner %q, mcp results %v; want the runner's id and no MCP results", list.Runner, list.MCP)
	}
	want := map[string]string{"exec_command": "rw", "read_file": "r", "write_file": "rw", "edit_file": "rw"}
	if len(specs) != len(want) {
		t.Errorf("got %d tools, want %d", len(specs), len(want))
	}
	for _, s := range specs {
		if perm, ok := want[s.Name]; !ok || s.Permission != perm || s.Source != "builtin" {
			t.Errorf("tool %q permission %q source %q, want %q builtin", s.Name, s.Permission, s.Source, want[s.Name])
		}
		var schema struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(s.Parameters, &schema); err != nil || schema.Type != "object" || s.Description == "" {
			t.Errorf("tool %q: description %q, parameters %s (%v)", s.Name, s.Description, s.Parameters, err)
		}
	}
}

func TestBadJobsFailOrAreLoggedAndTheLoopGoesOn(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.start(toolrunner.Config{Concurrency: 1})

	garbage := nats.NewMsg(omni.ToolSubject(omni.DefaultPool, "s1"))
	garbage.Data = []byte("\xc1 not msgpack")
	h.publish(garbage)
	noID := h.execJob("s1", "", "echo x")
	h.enqueue(noID)
	missing := h.execJob("s1", "missing-ws", "echo x")
	missing.Workspace = filepath.Join(h.ws, "does-not-exist")
	h.enqueue(missing)
	relative := h.execJob("s1", "relative-ws", "echo x")
	relative.Workspace = "relative/dir"
	h.enqueue(relative)
	unknown := h.execJob("s1", "unknown-tool", "echo x")
	unknown.Name = "no_such_tool"
	h.enqueue(unknown)
	h.enqueue(h.execJob("s1", "good", "echo fine"))
	// A job without its session id belongs to its subject's Session.
	bare := h.execJob("", "bare", "echo bare")
	m, err := bus.PackMsg(omni.ToolSubject(omni.DefaultPool, "s1"), bare)
	if err != nil {
		t.Fatal(err)
	}
	h.publish(m)
	if p := h.checkSegment("s1", h.waitOutput("s1", "bare")); p.Output != "bare\n" {
		t.Errorf("job without session id: output %q", p.Output)
	}

	p := h.checkSegment("s1", h.waitOutput("s1", "good"))
	if p.Output != "fine\n" || p.StopReason != omni.StatusCompleted {
		t.Errorf("good job output %q stop %q", p.Output, p.StopReason)
	}
	msgs := h.session("s1")
	for _, tt := range []struct{ id, want string }{
		{"missing-ws", "does not exist"},
		{"relative-ws", "not an absolute path"},
		{"unknown-tool", `unknown tool "no_such_tool"`},
	} {
		out := completes(of(msgs, tt.id))
		if len(out) != 1 || out[0].msg.Payload.StopReason != omni.StatusFailed || !strings.Contains(out[0].msg.Payload.Output, tt.want) {
			t.Errorf("%s: complete outputs %+v, want one failed output mentioning %q", tt.id, out, tt.want)
		}
	}
	logs := r.logs.String()
	for _, want := range []string{"undecodable tool job dropped", "without a valid session id or tool call id"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}

func TestRunWaitsForTheToolsStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	if err := h.env.JS.DeleteStream(ctx, omni.ToolsStream); err != nil {
		t.Fatal(err)
	}
	r := h.start(toolrunner.Config{})
	bustest.Eventually(t, wait, "the runner to report the missing stream", func() bool {
		return strings.Contains(r.logs.String(), "cannot create tool job consumer")
	})
	if _, err := bus.Setup(ctx, h.env.JS, h.env.Config); err != nil {
		t.Fatal(err)
	}
	h.enqueue(h.execJob("s1", "c1", "echo up"))
	if p := h.checkSegment("s1", h.waitOutput("s1", "c1")); p.Output != "up\n" {
		t.Errorf("output %q, want %q", p.Output, "up\n")
	}
}

// The shutdown tests do not run in parallel: they check that no goroutine
// of the toolrunner is left once Run returns.

func TestShutdownOfIdleRunnerIsPrompt(t *testing.T) {
	h := newHarness(t)
	r := h.start(toolrunner.Config{})
	bustest.Eventually(t, wait, "runner ready", func() bool {
		_, err := h.env.Conn.Request(toolrunner.ToolListSubject(omni.DefaultPool), nil, time.Second)
		return err == nil
	})
	began := time.Now()
	if err := r.stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	// A hang detector, not a speed check: an idle runner's shutdown waits
	// at most one fetch (FetchWait), never for a job or a timeout.
	t.Logf("Run returned after %v", time.Since(began))
	if d := time.Since(began); d > wait {
		t.Errorf("Run returned %v after its context ended", d)
	}
	checkNoGoroutines(t)
}

func TestShutdownLetsJobsFinishWithinGrace(t *testing.T) {
	h := newHarness(t)
	hb := h.watchHeartbeats("s1")
	r := h.start(toolrunner.Config{ShutdownGrace: wait})
	h.enqueue(h.execJob("s1", "c1", "sleep 0.5; echo done"))
	bustest.Eventually(t, wait, "job running", func() bool { return len(hb.naming("c1")) > 0 })
	if err := r.stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	checkNoGoroutines(t)
	p := h.checkSegment("s1", of(h.session("s1"), "c1"))
	if p.Output != "done\n" || p.StopReason != omni.StatusCompleted {
		t.Errorf("output %q stop %q, want the job to finish", p.Output, p.StopReason)
	}
}

func TestShutdownCancelsJobsAfterGraceWithFailedOutput(t *testing.T) {
	h := newHarness(t)
	hb := h.watchHeartbeats("s1")
	r := h.start(toolrunner.Config{ShutdownGrace: 200 * time.Millisecond})
	h.enqueue(h.execJob("s1", "c1", "echo started; sleep 30"))
	bustest.Eventually(t, wait, "job running", func() bool { return len(hb.naming("c1")) > 0 })
	began := time.Now()
	if err := r.stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("Run returned %v after its context ended", d)
	}
	checkNoGoroutines(t)
	p := h.checkSegment("s1", of(h.session("s1"), "c1"))
	if p.StopReason != omni.StatusFailed || !strings.Contains(p.Output, "toolrunner shutting down") {
		t.Errorf("output %q stop %q, want a failed output naming the shutdown", p.Output, p.StopReason)
	}
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	c := toolrunner.DefaultConfig()
	if c.Pool != omni.DefaultPool || c.Concurrency != 8 || c.RunnerID == "" || c.HeartbeatInterval != time.Second ||
		c.MaxOutput != 16000 || c.DefaultTimeout != 120*time.Second || c.ShutdownGrace != 10*time.Second {
		t.Errorf("DefaultConfig() = %+v", c)
	}
	var zero toolrunner.Config
	if err := zero.Validate(); err != nil || zero.Concurrency != 8 || zero.RunnerID == "" || zero.MaxOutput != 16000 {
		t.Errorf("Config{}.Validate() = %v, left %+v; want the defaults", err, zero)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate() of defaults = %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*toolrunner.Config)
	}{
		{"pool with a dot", func(c *toolrunner.Config) { c.Pool = "a.b" }},
		{"pool wildcard", func(c *toolrunner.Config) { c.Pool = ">" }},
		{"negative concurrency", func(c *toolrunner.Config) { c.Concurrency = -1 }},
		{"negative heartbeat", func(c *toolrunner.Config) { c.HeartbeatInterval = -time.Second }},
		{"negative max output", func(c *toolrunner.Config) { c.MaxOutput = -1 }},
		{"negative timeout", func(c *toolrunner.Config) { c.DefaultTimeout = -time.Second }},
		{"negative grace", func(c *toolrunner.Config) { c.ShutdownGrace = -time.Second }},
	}
	for _, tt := range tests {
		c := toolrunner.Config{}
		tt.mutate(&c)
		if err := c.Validate(); !errors.Is(err, toolrunner.ErrInvalidConfig) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidConfig", tt.name, err)
		}
	}
	if err := toolrunner.Run(context.Background(), nil, toolrunner.Config{Concurrency: -1}, zerolog.Nop()); !errors.Is(err, toolrunner.ErrInvalidConfig) {
		t.Errorf("Run with a bad config = %v, want ErrInvalidConfig", err)
	}
}

func TestToolEnvironmentHoldsNoSecrets(t *testing.T) {
	// The attack: a tool runs `env` and reads Floe's credentials out of the
	// toolrunner's environment. Tests in this package do not run in
	// parallel with t.Setenv, so this test is not parallel.
	secrets := map[string]string{
		"FLOE_API_TOKEN":     "alice:tok-secret-1",
		"OPENAI_API_KEY":     "sk-openai-secret-2",
		"ANTHROPIC_API_KEY":  "sk-ant-secret-3",
		"FLOE_NATS_PASSWORD": "nats-secret-4",
		"FLOE_NATS_CREDS":    "/secret/path/creds-5",
		"FLOE_NATS_URL":      "nats://engine:secret-6@127.0.0.1:4222",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	t.Setenv("FLOE_TOOL_ENV", "FLOE_TEST_EXTRA")
	t.Setenv("FLOE_TEST_EXTRA", "extra-visible")
	h := newHarness(t)
	h.start(toolrunner.Config{})
	h.enqueue(h.execJob("s-env", "c-env", "env"))
	p := h.checkSegment("s-env", h.waitOutput("s-env", "c-env"))
	for k, v := range secrets {
		if strings.Contains(p.Output, k+"=") || strings.Contains(p.Output, v) {
			t.Errorf("env output shows %s:\n%s", k, p.Output)
		}
	}
	for _, want := range []string{"PATH=", "FLOE_SESSION_ID=s-env", "FLOE_TOOL_CALL_ID=c-env", "FLOE_TEST_EXTRA=extra-visible"} {
		if !strings.Contains(p.Output, want) {
			t.Errorf("env output lacks %s:\n%s", want, p.Output)
		}
	}
}

func TestSpecialFilesFailInBoundedTimeAndFreeTheSlots(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	if err := syscall.Mkfifo(filepath.Join(h.ws, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(h.ws, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// Two slots, and more hostile calls than slots: a call that held its
	// slot would starve the last job.
	h.start(toolrunner.Config{Concurrency: 2})
	job := func(id, name string, a map[string]any) omni.ToolJob {
		b, _ := json.Marshal(a)
		return omni.ToolJob{SessionID: "s-special", ToolCallID: id, Name: name, Arguments: string(b),
			Workspace: h.ws, EnqueuedUnixMs: time.Now().UnixMilli()}
	}
	hostile := []omni.ToolJob{
		job("r-fifo", "read_file", map[string]any{"file_path": "fifo"}),
		job("w-fifo", "write_file", map[string]any{"file_path": "fifo", "content": "x"}),
		job("e-fifo", "edit_file", map[string]any{"file_path": "fifo", "old_string": "a", "new_string": "b"}),
		job("r-sparse", "read_file", map[string]any{"file_path": "sparse"}),
		job("e-sparse", "edit_file", map[string]any{"file_path": "sparse", "old_string": "a", "new_string": "b"}),
		job("x-fifo", "exec_command", map[string]any{"description": "blocks on the FIFO", "cmd": "cat fifo", "timeout_ms": 300}),
	}
	for _, j := range hostile {
		h.enqueue(j)
	}
	for _, j := range hostile {
		p := h.checkSegment("s-special", h.waitOutput("s-special", j.ToolCallID))
		if p.StopReason != omni.StatusFailed {
			t.Errorf("%s: output %q stop_reason %q, want failed", j.ToolCallID, p.Output, p.StopReason)
		}
	}
	h.enqueue(h.execJob("s-special", "after-1", "echo ok"))
	h.enqueue(h.execJob("s-special", "after-2", "echo ok"))
	for _, id := range []string{"after-1", "after-2"} {
		if p := h.checkSegment("s-special", h.waitOutput("s-special", id)); p.Output != "ok\n" {
			t.Errorf("%s after the hostile calls = %q, want ok", id, p.Output)
		}
	}
}
