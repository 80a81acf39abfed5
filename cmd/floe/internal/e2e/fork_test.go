package e2e

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
