package e2e

import (
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
	"floe.dev/services/gateway/client"
)

// forkParent records a Session through the real engine and toolrunner: a
// Task whose call's output lands after the request_end (a slow command),
// then a plain answer, then a Task with a quick call. It returns the
// Session id after the tracer has written all of it.
func forkParent(t *testing.T, e *env, c *client.Client, f *rcFake) string {
	t.Helper()
	s, err := c.CreateSession(ctxT(t), client.CreateSession{Model: rcModel, Workspace: e.ws})
	if err != nil {
		t.Fatal(err)
	}
	for _, prompt := range []string{"first", "second"} {
		taskID, err := c.SubmitTask(ctxT(t), s.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: prompt}}})
		if err != nil {
			t.Fatal(err)
		}
		if rs, status := e.wait(s.ID, taskID); status != omni.StatusCompleted {
			t.Fatalf("parent Task %q: %s; stream %v", prompt, status, labels(rs, noPartials))
		}
	}
	e.lcTraced(s.ID)
	return s.ID
}

func forkParentReplies() []rcReply {
	toolTurn := func(id, cmd string) rcReply {
		return rcStreamed(rcRoleChunk(), rcTextChunk("running "+id), rcToolStartChunk(0, id, "exec_command", rcExecArgs(id, cmd)),
			rcFinishChunk("tool_calls"), rcUsageChunk(100, 5))
	}
	return []rcReply{
		toolTurn("call_slow", "sleep 0.3; echo slow"),
		rcAnswer("done one"),
		toolTurn("call_quick", "echo quick"),
		rcAnswer("done two"),
	}
}

// traceRecs returns the parent's Trace-class stream messages (the records
// with their sequences) and every stream position of the Session.
func traceRecs(t *testing.T, e *env, sid string) (recs []rec, positions []uint64) {
	t.Helper()
	for _, r := range e.lcAll(sid, nil) {
		positions = append(positions, r.seq)
		if slices.Contains(omni.TraceClasses, r.class) {
			recs = append(recs, r)
		}
	}
	return recs, positions
}

func encodeAll(t *testing.T, msgs []omni.Message) []string {
	t.Helper()
	out := make([]string, len(msgs))
	for i := range msgs {
		m := msgs[i]
		if m.Payload.Type == omni.TypeToolCallOutput && m.Payload.Output == omni.InterruptedOutput {
			m.Timestamp = "" // the placeholder is made when the context is
		}
		out[i] = string(omni.MustMarshal(&m))
	}
	return out
}

// The property: for 200 random stream positions of a recorded Session,
// the context an engine resumes the fork with (what its next model request
// is built from) equals the fold of the parent's records up to that
// position; and the parent is never changed by its forks.
func TestForkAtRandomPositionsResumesTheFoldOfTheParentsPrefix(t *testing.T) {
	f := rcNewFake(t, forkParentReplies()...)
	e := rcEnv(t, f, nil)
	c := e.gw(t, nil)
	sid := forkParent(t, e, c, f)
	recs, positions := traceRecs(t, e, sid)
	files, _ := trace.Files(e.home, sid)
	before := readString(t, files[0])

	rng := rand.New(rand.NewSource(23))
	for i := range 200 {
		at := positions[rng.Intn(len(positions))]
		fork, err := c.Fork(ctxT(t), sid, at)
		if err != nil {
			t.Fatalf("cut %d: Fork(%d): %v", i, at, err)
		}
		var prefix []omni.Message
		for _, r := range recs {
			if r.seq <= at {
				prefix = append(prefix, r.msg)
			}
		}
		want := encodeAll(t, engine.ModelContext(prefix))
		refs, _, bad, err := engine.ResumeContext(ctxT(t), e.st.JS, e.home, fork.ID)
		if err != nil || bad != 0 {
			t.Fatalf("cut %d at %d: resume the fork: %v, %d bad records", i, at, err, bad)
		}
		got := make([]omni.Message, len(refs))
		for k, m := range refs {
			got[k] = *m
		}
		if g := encodeAll(t, got); !slices.Equal(g, want) {
			t.Fatalf("cut %d at %d: the fork resumes with\n  %s\nthe fold of the parent's prefix is\n  %s", i, at, strings.Join(g, "\n  "), strings.Join(want, "\n  "))
		}
	}
	if after := readString(t, files[0]); after != before {
		t.Fatal("the parent's Trace changed while it was forked")
	}
	if now, _ := trace.Files(e.home, sid); !slices.Equal(now, files) {
		t.Fatalf("the parent's Trace files are %v, were %v", now, files)
	}
}

// A fork cut right after the request_end of a request whose call's output
// came later runs its next Task with that call interrupted, and goes on
// in its own Trace; the parent's Trace does not change.
func TestForkAfterACommittedCallRunsWithTheCallInterrupted(t *testing.T) {
	f := rcNewFake(t, append(forkParentReplies(), rcAnswer("forked answer"))...)
	e := rcEnv(t, f, nil)
	c := e.gw(t, nil)
	sid := forkParent(t, e, c, f)
	recs, _ := traceRecs(t, e, sid)
	var at uint64
	for _, r := range recs {
		if r.msg.Payload.Type == omni.TypeRequestEnd {
			at = r.seq // the first request_end: call_slow's output comes later
			break
		}
	}
	files, _ := trace.Files(e.home, sid)
	before := readString(t, files[0])
	fork, err := c.Fork(ctxT(t), sid, at)
	if err != nil {
		t.Fatal(err)
	}
	taskID, err := c.SubmitTask(ctxT(t), fork.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "go on"}}})
	if err != nil {
		t.Fatal(err)
	}
	if rs, status := e.wait(fork.ID, taskID); status != omni.StatusCompleted {
		t.Fatalf("fork's Task: %s; stream %v", status, labels(rs, noPartials))
	}
	got := sentContext(f.body(4))
	want := []string{
		"user:first",
		`assistant:running call_slow[call call_slow exec_command ` + rcExecArgs("call_slow", "sleep 0.3; echo slow") + `]`,
		"tool:call_slow:" + omni.InterruptedOutput,
		"user:go on",
	}
	if len(got) < 1 || !slices.Equal(got[1:], want) {
		t.Fatalf("the fork's model request is\n  %s\nwant (after the system prompt)\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	forkFiles, err := trace.Files(e.home, fork.ID)
	if err != nil || len(forkFiles) != 1 {
		t.Fatalf("fork's Trace files: %v, %v", forkFiles, err)
	}
	eventually(t, 10*time.Second, "the fork's Task in its Trace", func() bool {
		return strings.Contains(readString(t, forkFiles[0]), "forked answer")
	})
	msgs, skipped, err := trace.Read(strings.NewReader(readString(t, forkFiles[0])))
	if err != nil || len(skipped) > 0 || msgs[0].Type != omni.KindSessionMeta {
		t.Fatalf("fork's Trace: %v, %d skipped", err, len(skipped))
	}
	if ff, ok := msgs[0].Payload.ForkedFrom(); !ok || ff.SessionID != sid || ff.Seq != at {
		t.Errorf("fork's head forked_from = %+v, want %s at %d", ff, sid, at)
	}
	if n := bytes.Count([]byte(readString(t, forkFiles[0])), []byte(`"session_meta"`)); n != 1 {
		t.Errorf("fork's Trace holds %d session_meta, want 1", n)
	}
	if after := readString(t, files[0]); after != before {
		t.Fatal("the parent's Trace changed when its fork ran")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(forkFiles[0]), fork.ID+"_002.jsonl")); err == nil {
		t.Error("the fork rotated its Trace without a compaction")
	}
}

// A fork of a running parent, taken mid-stream with the engine running
// the parent's Task: once while its call runs (a committed call without
// output yet), once while its next answer streams (an open request with
// partial text). Each fork is closed there as an interrupt would; the
// parent's Task goes on undisturbed and completes with everything, and
// neither fork changes as the parent goes on.
func TestForkOfARunningParentMidStream(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	held := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rcWriteEvents(w, []string{rcRoleChunk(), rcTextChunk("half of ")})
		select {
		case <-release:
		case <-r.Context().Done():
			return
		case <-time.After(rcBound):
			return
		}
		for _, c := range []string{rcTextChunk("the answer"), rcFinishChunk("stop"), rcUsageChunk(120, 7)} {
			fmt.Fprintf(w, "data: %s\n\n", c)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
	}
	wait := "while [ ! -e go ]; do sleep 0.05; done; echo slow"
	f := rcNewFake(t,
		rcStreamed(rcRoleChunk(), rcTextChunk("running call_wait"), rcToolStartChunk(0, "call_wait", "exec_command", rcExecArgs("call_wait", wait)),
			rcFinishChunk("tool_calls"), rcUsageChunk(100, 5)),
		held,
		rcAnswer("forked answer"),
	)
	e := rcEnv(t, f, nil)
	c := e.gw(t, nil)
	s, err := c.CreateSession(ctxT(t), client.CreateSession{Model: rcModel, Workspace: e.ws})
	if err != nil {
		t.Fatal(err)
	}
	taskID, err := c.SubmitTask(ctxT(t), s.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "work"}}})
	if err != nil {
		t.Fatal(err)
	}
	forkTrace := func(id string) (string, string) {
		t.Helper()
		files, err := trace.Files(e.home, id)
		if err != nil || len(files) != 1 {
			t.Fatalf("fork %s: Trace files %v, %v", id, files, err)
		}
		text := readString(t, files[0])
		msgs, skipped, err := trace.Read(strings.NewReader(text))
		if err != nil || len(skipped) > 0 {
			t.Fatalf("fork %s's Trace: %v, %d skipped", id, err, len(skipped))
		}
		return traceKinds(msgs), text
	}
	running := func() {
		t.Helper()
		if got, err := c.GetSession(ctxT(t), s.ID); err != nil || got.State != omni.StateRunning {
			t.Fatalf("the parent is %+v (%v) while its Task runs", got, err)
		}
	}

	// 1. The call is committed and running.
	rcWaitFor(e, s.ID, "the committed call", func(r rec) bool {
		return r.msg.Type == omni.KindEvent && r.msg.Payload.Type == omni.TypeRequestEnd && r.msg.Payload.Status == omni.StatusCompleted
	})
	running()
	forkA, err := c.Fork(ctxT(t), s.ID, 0)
	if err != nil {
		t.Fatalf("fork while the call runs: %v", err)
	}
	kindsA, traceA := forkTrace(forkA.ID)
	if !strings.HasSuffix(kindsA, "text request_begin text tool_call token_usage request_end/completed abort") || strings.Contains(kindsA, "tool_call_output") {
		t.Errorf("the fork taken while the call ran: %s\nwant the committed call, no output, then abort", kindsA)
	}

	// 2. The call ends; the next answer streams and is held half-way.
	if err := os.WriteFile(filepath.Join(e.ws, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	partial := rcWaitFor(e, s.ID, "the next answer streaming", func(r rec) bool {
		return r.class == omni.ClassPartial && strings.Contains(string(r.raw), "half of")
	})
	running()
	forkB, err := c.Fork(ctxT(t), s.ID, partial.seq)
	if err != nil {
		t.Fatalf("fork mid-answer: %v", err)
	}
	if forkB.ForkedFrom == nil || forkB.ForkedFrom.Seq != partial.seq {
		t.Errorf("fork mid-answer: forkedFrom %+v, want seq %d", forkB.ForkedFrom, partial.seq)
	}
	kindsB, traceB := forkTrace(forkB.ID)
	if !strings.HasSuffix(kindsB, "request_end/completed tool_call_output request_begin token_usage request_end/aborted abort") {
		t.Errorf("the fork taken mid-answer: %s\nwant the output, then the open request aborted", kindsB)
	}

	// 3. The parent goes on and completes, unaffected.
	once.Do(func() { close(release) })
	rs, status := e.wait(s.ID, taskID)
	if status != omni.StatusCompleted {
		t.Fatalf("the parent's Task: %s; stream %v", status, labels(rs, noPartials))
	}
	e.lcTraced(s.ID)
	files, err := trace.Files(e.home, s.ID)
	if err != nil || len(files) != 1 {
		t.Fatalf("parent's Trace files %v, %v", files, err)
	}
	msgs, _, _ := trace.Read(strings.NewReader(readString(t, files[0])))
	if k := traceKinds(msgs); !strings.HasSuffix(k, "request_end/completed tool_call_output request_begin text token_usage request_end/completed") || strings.Contains(k, "abort") {
		t.Errorf("the parent's Trace: %s\nwant its Task whole, nothing aborted", k)
	}
	if ff, ok := msgs[0].Payload.ForkedFrom(); ok {
		t.Errorf("the parent's head has forked_from %+v", ff)
	}
	last := msgs[len(msgs)-3].Payload
	if last.Text != "half of the answer" {
		t.Errorf("the parent's answer %q, want it whole", last.Text)
	}
	for id, before := range map[string]string{forkA.ID: traceA, forkB.ID: traceB} {
		if _, after := forkTrace(id); after != before {
			t.Errorf("fork %s changed as its parent went on", id)
		}
	}

	// 4. The fork taken mid-answer runs from the cut: the half answer is
	// not in its context.
	taskB, err := c.SubmitTask(ctxT(t), forkB.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "go on"}}})
	if err != nil {
		t.Fatal(err)
	}
	if rs, status := e.wait(forkB.ID, taskB); status != omni.StatusCompleted {
		t.Fatalf("fork's Task: %s; stream %v", status, labels(rs, noPartials))
	}
	got := sentContext(f.body(2))
	want := []string{
		"user:work",
		`assistant:running call_wait[call call_wait exec_command ` + rcExecArgs("call_wait", wait) + `]`,
		"tool:call_wait:slow\n",
		"user:go on",
	}
	if len(got) < 1 || !slices.Equal(got[1:], want) {
		t.Fatalf("the fork's model request is\n  %q\nwant (after the system prompt)\n  %q", got, want)
	}
}

// traceKinds lists records by payload type (and status), session_meta as
// "meta", leaving out approval decisions (their place among a request's
// last records is a race between the engine and the approver).
func traceKinds(msgs []omni.Message) string {
	var out []string
	for _, m := range msgs {
		if m.Payload.Type == omni.TypeApprovalDecision {
			continue
		}
		k := m.Payload.Type
		if m.Type == omni.KindSessionMeta {
			k = "meta"
		}
		if m.Payload.Status != "" {
			k += "/" + m.Payload.Status
		}
		out = append(out, k)
	}
	return strings.Join(out, " ")
}
