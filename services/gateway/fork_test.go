package gateway_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// recordSession publishes a Session's messages as an engine would: a Task
// whose call's output lands after its request_end, then a second request
// left open. It returns the sequence of each message by name.
func recordSession(t *testing.T, g *testGateway, sid string) map[string]uint64 {
	t.Helper()
	seqs := map[string]uint64{}
	pub := func(name string, m omni.Message) {
		ack, err := g.env.JS.Publish(ctxT(t), omni.SessionSubject(sid, omni.ClassOf(&m)), omni.MustMarshal(&m))
		if err != nil {
			t.Fatal(err)
		}
		seqs[name] = ack.Sequence
	}
	pub("meta", omni.SessionMeta(omni.Meta{SessionID: sid, Provider: "scripted", ModelID: "demo", SystemPrompt: "be brief", Workspace: "/w"}))
	pub("tools", omni.ToolListReady(nil))
	pub("prompt", omni.UserText("list the files"))
	pub("begin1", omni.RequestBegin())
	pub("partial", omni.Partial("text", "delta", "looking", "", ""))
	pub("text1", omni.Text(omni.RoleAssistant, "looking"))
	tc := omni.ToolCall("exec_command", `{"cmd":"ls"}`, "call_A")
	tc.Payload.StopReason = omni.StatusCompleted
	pub("callA", tc)
	pub("end1", omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	pub("outA", omni.ToolCallOutput("call_A", "a b", omni.StatusCompleted))
	pub("begin2", omni.RequestBegin())
	pub("text2", omni.Text(omni.RoleAssistant, "half an answ"))
	return seqs
}

// traceRecords returns the records of a Session's Trace file 1.
func traceRecords(t *testing.T, c *client.Client, sid string) []omni.Message {
	t.Helper()
	b, err := c.Trace(ctxT(t), sid, 1)
	if err != nil {
		t.Fatalf("Trace(%s, 1): %v", sid, err)
	}
	msgs, skipped, err := trace.Read(bytes.NewReader(b))
	if err != nil || len(skipped) > 0 {
		t.Fatalf("Trace(%s, 1) reads with %v, %d lines skipped", sid, err, len(skipped))
	}
	return msgs
}

func kinds(msgs []omni.Message) string {
	var out []string
	for _, m := range msgs {
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

func TestForkCopiesSettingsAndCutsTheHistory(t *testing.T) {
	t.Parallel()
	g := startGateway(t, newBus(t), "", nil)
	parent := createSession(t, g.Alice, client.CreateSession{
		ApprovalMode: omni.ApproveAlwaysAsk, SystemPrompt: "be brief", MaxTurns: 7,
		Compaction: &client.Compaction{MaxContextLength: 5000, Mode: omni.ModeDiscard}, Title: "the parent",
	})
	seqs := recordSession(t, g, parent.ID)
	before, err := g.Alice.Messages(ctxT(t), parent.ID)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		at   uint64
		want string // the fork's Trace, as kinds
		seq  uint64
	}{
		{"at the end", 0, "meta tool_list_ready text request_begin text tool_call request_end/completed tool_call_output request_begin text token_usage request_end/aborted abort", seqs["text2"]},
		{"at a mid-history request_end", seqs["end1"], "meta tool_list_ready text request_begin text tool_call request_end/completed abort", seqs["end1"]},
		{"right after a committed call whose output came later", seqs["callA"], "meta tool_list_ready text request_begin text tool_call token_usage request_end/aborted abort", seqs["callA"]},
		{"on a partial", seqs["partial"], "meta tool_list_ready text request_begin token_usage request_end/aborted abort", seqs["partial"]},
		{"after the output", seqs["outA"], "meta tool_list_ready text request_begin text tool_call request_end/completed tool_call_output", seqs["outA"]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fork, err := g.Alice.Fork(ctxT(t), parent.ID, tc.at)
			if err != nil {
				t.Fatalf("Fork(%d): %v", tc.at, err)
			}
			if fork.ID == parent.ID || fork.ForkedFrom == nil || *fork.ForkedFrom != (client.ForkedFrom{SessionID: parent.ID, Seq: tc.seq}) {
				t.Errorf("fork %s forkedFrom = %+v, want %s at %d", fork.ID, fork.ForkedFrom, parent.ID, tc.seq)
			}
			got, err := g.Alice.GetSession(ctxT(t), fork.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Model != parent.Model || got.Workspace != parent.Workspace || got.ApprovalMode != parent.ApprovalMode ||
				got.SystemPrompt != parent.SystemPrompt || got.MaxTurns != parent.MaxTurns || *got.Compaction != *parent.Compaction ||
				got.State != omni.StateIdle || got.ForkedFrom == nil || got.ForkedFrom.Seq != tc.seq {
				t.Errorf("GET fork = %+v, want the parent's settings %+v and forkedFrom", got, parent)
			}
			recs := traceRecords(t, g.Alice, fork.ID)
			if k := kinds(recs); k != tc.want {
				t.Errorf("fork's Trace = %s\nwant %s", k, tc.want)
			}
			head := recs[0].Payload
			if f, ok := head.ForkedFrom(); !ok || f.SessionID != parent.ID || f.Seq != tc.seq || head.SessionID != fork.ID || head.SystemPrompt != "be brief" {
				t.Errorf("fork's head = %+v forked_from %+v, want the fork's id and forked_from", head.Meta(), f)
			}
			// /messages reads the fork's Trace.
			msgs, err := g.Alice.Messages(ctxT(t), fork.ID)
			if err != nil || len(msgs.Messages) != len(recs) {
				t.Errorf("fork's messages: %d, %v; want its %d Trace records", len(msgs.Messages), err, len(recs))
			}
		})
	}
	after, err := g.Alice.Messages(ctxT(t), parent.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Messages) != len(before.Messages) {
		t.Fatalf("parent's messages: %d after the forks, %d before", len(after.Messages), len(before.Messages))
	}
	for i := range before.Messages {
		if !bytes.Equal(after.Messages[i], before.Messages[i]) {
			t.Errorf("parent's message %d changed by its forks: %s, was %s", i, after.Messages[i], before.Messages[i])
		}
	}
	if p, _ := g.Alice.GetSession(ctxT(t), parent.ID); p.ForkedFrom != nil {
		t.Errorf("the parent reports forkedFrom %+v", p.ForkedFrom)
	}
}

// Every message of /messages carries its position, whole or windowed, and
// a fork at a message's position is the fork at its stream sequence.
func TestForkAtAMessagesPosition(t *testing.T) {
	t.Parallel()
	g := startGateway(t, newBus(t), "", nil)
	parent := createSession(t, g.Alice, client.CreateSession{})
	seqs := recordSession(t, g, parent.ID)
	// The records of /messages, in order (the partial is not one).
	names := []string{"meta", "tools", "prompt", "begin1", "text1", "callA", "end1", "outA", "begin2", "text2"}
	whole, err := g.Alice.Messages(ctxT(t), parent.ID)
	if err != nil {
		t.Fatal(err)
	}
	window, err := g.Alice.MessagesWindow(ctxT(t), parent.ID, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []*client.Messages{whole, window} {
		if len(h.Messages) != len(names) || len(h.Positions) != len(names) {
			t.Fatalf("/messages: %d messages, positions %v; want %d of each", len(h.Messages), h.Positions, len(names))
		}
		for i, p := range h.Positions {
			if p != i {
				t.Fatalf("positions = %v, want each message's ordinal", h.Positions)
			}
		}
	}
	for i, name := range names {
		byRecord, err := g.Alice.ForkAtRecord(ctxT(t), parent.ID, whole.Positions[i])
		if err != nil {
			t.Fatalf("ForkAtRecord(%s): %v", name, err)
		}
		f := byRecord.ForkedFrom
		if f == nil || f.SessionID != parent.ID || f.Seq != seqs[name] || f.Record == nil || *f.Record != i {
			t.Errorf("fork at %s: forkedFrom %+v, want %s at seq %d, record %d", name, f, parent.ID, seqs[name], i)
		}
		bySeq, err := g.Alice.Fork(ctxT(t), parent.ID, seqs[name])
		if err != nil {
			t.Fatalf("Fork(%s): %v", name, err)
		}
		got, want := traceRecords(t, g.Alice, byRecord.ID), traceRecords(t, g.Alice, bySeq.ID)
		if kinds(got) != kinds(want) {
			t.Errorf("fork at %s's position: %s\nat its sequence: %s", name, kinds(got), kinds(want))
		}
		// The fork's history ends with the message it was cut at (then
		// what closes the cut).
		if i > 0 && string(omni.MustMarshal(&got[i])) != string(whole.Messages[i]) {
			t.Errorf("fork at %s: record %d = %s, want %s", name, i, omni.MustMarshal(&got[i]), whole.Messages[i])
		}
	}
	after, err := g.Alice.Messages(ctxT(t), parent.ID)
	if err != nil || len(after.Messages) != len(whole.Messages) {
		t.Fatalf("parent after its forks: %d messages, %v", len(after.Messages), err)
	}
	for i := range whole.Messages {
		if !bytes.Equal(after.Messages[i], whole.Messages[i]) {
			t.Errorf("parent's message %d changed by its forks", i)
		}
	}
}

func TestForkRejectsABadAtSeqAndCreatesNothing(t *testing.T) {
	t.Parallel()
	g := startGateway(t, newBus(t), "", nil)
	parent := createSession(t, g.Alice, client.CreateSession{})
	other := createSession(t, g.Alice, client.CreateSession{})
	seqs := recordSession(t, g, parent.ID)
	otherSeqs := recordSession(t, g, other.ID)
	for _, body := range []string{
		`{"atSeq":` + strconv.FormatUint(otherSeqs["text1"], 10) + `}`,      // another Session's message
		`{"atSeq":` + strconv.FormatUint(otherSeqs["text2"]+1000, 10) + `}`, // past the stream's end
		`{"atSeq":0}`, `{"atSeq":-3}`, `{"atSeq":1.5}`, `{"atSeq":"abc"}`, `{"atSeq":true}`,
		`{"atSeq":"1-` + strconv.FormatUint(seqs["end1"], 10) + `"}`, // another stream incarnation's id
		`{"at":3}`, `[1]`,
		`{"atRecord":-1}`, `{"atRecord":99}`, `{"atRecord":1.5}`, `{"atRecord":"2"}`, // not a record position
		`{"atRecord":2,"atSeq":` + strconv.FormatUint(seqs["end1"], 10) + `}`, // both
	} {
		req, _ := http.NewRequest(http.MethodPost, g.URL+"/api/sessions/"+parent.ID+"/fork", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Code, Message string }
		}
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || e.Error.Code == "" {
			t.Errorf("fork %s = %d %+v, want 400 with an error code", body, resp.StatusCode, e)
		}
	}
	list, err := g.Alice.ListSessions(ctxT(t))
	if err != nil || len(list) != 2 {
		t.Errorf("sessions after refused forks: %d, %v; want the two", len(list), err)
	}
	// A Session no Task ran in forks into an empty one with its settings.
	fresh := createSession(t, g.Alice, client.CreateSession{MaxTurns: 3})
	if fork, err := g.Alice.Fork(ctxT(t), fresh.ID, 0); err != nil || fork.MaxTurns != 3 || fork.ForkedFrom == nil || fork.ForkedFrom.SessionID != fresh.ID {
		t.Errorf("fork of a fresh Session = %+v, %v", fork, err)
	}
	// Someone who cannot see the Session cannot fork it.
	var ae *client.APIError
	if _, err := g.Bob.Fork(ctxT(t), parent.ID, 0); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Errorf("Bob forks Alice's session: %v, want 404", err)
	}
	// An SSE event id of this stream is taken.
	info, err := g.env.JS.Stream(ctxT(t), omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatInt(info.CachedInfo().Created.UnixMilli(), 10) + "-" + strconv.FormatUint(seqs["end1"], 10)
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/api/sessions/"+parent.ID+"/fork", strings.NewReader(`{"atSeq":"`+id+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("fork at event id %s: %v %v, want 201", id, resp.Status, err)
	}
	var fork client.Session
	json.NewDecoder(resp.Body).Decode(&fork)
	resp.Body.Close()
	if fork.ForkedFrom == nil || fork.ForkedFrom.Seq != seqs["end1"] {
		t.Errorf("fork at event id: forkedFrom %+v, want seq %d", fork.ForkedFrom, seqs["end1"])
	}
}

func TestForkOfAnImportedTraceOfTheOriginal(t *testing.T) {
	t.Parallel()
	g, ws := importEnv(t, nil)
	// The original's Trace: a committed call without output, then a
	// request that never ended.
	lines := []string{
		metaLine(importSID, "deepseek", ws),
		userLine,
		`{"timestamp":"2026-07-18T03:10:24.000Z","type":"event_msg","payload":{"type":"request_begin"}}`,
		`{"timestamp":"2026-07-18T03:10:25.000Z","type":"model_msg","payload":{"type":"tool_call","role":"assistant","name":"exec_command","arguments":"{\"cmd\":\"ls\"}","tool_call_id":"call_1","stop_reason":"completed"}}`,
		`{"timestamp":"2026-07-18T03:10:26.000Z","type":"event_msg","payload":{"type":"request_end","status":"completed"}}`,
		`{"timestamp":"2026-07-18T03:10:27.000Z","type":"event_msg","payload":{"type":"request_begin"}}`,
	}
	if _, err := g.Alice.ImportTrace(ctxT(t), client.ImportTrace{DataBase64: b64(strings.Join(lines, "\n") + "\n")}); err != nil {
		t.Fatal(err)
	}
	fork, err := g.Alice.Fork(ctxT(t), importSID, 0)
	if err != nil {
		t.Fatalf("Fork of the imported Session: %v", err)
	}
	if fork.ForkedFrom == nil || *fork.ForkedFrom != (client.ForkedFrom{SessionID: importSID, Seq: 0}) || fork.Model != "openai:m-1" || fork.SystemPrompt != "be brief" {
		t.Errorf("fork = %+v, want forkedFrom %s at 0 and the imported Session's model and prompt", fork, importSID)
	}
	recs := traceRecords(t, g.Alice, fork.ID)
	if got, want := kinds(recs), "meta text request_begin tool_call request_end/completed request_begin token_usage request_end/aborted abort"; got != want {
		t.Errorf("fork's Trace = %s\nwant %s", got, want)
	}
	// The imported records have no stream position: a sequence is refused.
	var ae *client.APIError
	if _, err := g.Alice.Fork(ctxT(t), importSID, 1); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Errorf("fork of the imported Session at 1: %v, want 400", err)
	}
}

// The replay provider reads any Trace file it is given: no Session made
// through the API may use it.
func TestCreateRefusesTheReplayProvider(t *testing.T) {
	t.Parallel()
	g := startGateway(t, newBus(t), "", nil)
	var ae *client.APIError
	if _, err := g.Alice.CreateSession(ctxT(t), client.CreateSession{Model: "replay:/etc/passwd"}); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Errorf("create with replay:/etc/passwd = %v, want 400", err)
	}
}

// A cut inside a subagent's span: the parent's run_subagent call is
// interrupted, and the child, whose run was open, is forked at the same
// position; the fork's pointer names the child's fork.
func TestForkInsideASubagentSpanForksTheChild(t *testing.T) {
	t.Parallel()
	g := startGateway(t, newBus(t), "", nil)
	parent := createSession(t, g.Alice, client.CreateSession{})
	sessions, err := bus.Open(ctxT(t), g.env.JS)
	if err != nil {
		t.Fatal(err)
	}
	child := parent.ID[:len(parent.ID)-8] + "c0c0c0c0"
	if err := sessions.Create(ctxT(t), &omni.SessionRecord{ID: child, Model: parent.Model, Workspace: parent.Workspace,
		ApprovalMode: omni.ApproveAllowAll, Principal: "alice", Parent: parent.ID, Depth: 1, State: omni.StateRunning,
		CreatedUnixMs: parent.CreatedUnixMs}); err != nil {
		t.Fatal(err)
	}
	var at uint64
	pub := func(sid string, m omni.Message) uint64 {
		ack, err := g.env.JS.Publish(ctxT(t), omni.SessionSubject(sid, omni.ClassOf(&m)), omni.MustMarshal(&m))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	pub(parent.ID, omni.SessionMeta(omni.Meta{SessionID: parent.ID, Provider: "scripted", ModelID: "demo", Workspace: "/w"}))
	pub(parent.ID, omni.UserText("delegate"))
	pub(parent.ID, omni.RequestBegin())
	tc := omni.ToolCall("run_subagent", `{"description":"d","prompt":"look around"}`, "call_sub")
	tc.Payload.StopReason = omni.StatusCompleted
	pub(parent.ID, tc)
	pub(parent.ID, omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	pub(parent.ID, omni.Subagent(child))
	pub(child, omni.SessionMeta(omni.Meta{SessionID: child, Provider: "scripted", ModelID: "demo", Workspace: "/w", Source: "subagent"}))
	pub(child, omni.UserText("look around"))
	pub(child, omni.RequestBegin())
	at = pub(child, omni.Text(omni.RoleAssistant, "looking")) // a position of the child, not of the parent
	mid := pub(parent.ID, omni.Partial("text", "delta", "x", "", ""))
	pub(child, omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	pub(parent.ID, omni.ToolCallOutput("call_sub", "the child's answer", omni.StatusCompleted))

	var ae *client.APIError
	if _, err := g.Alice.Fork(ctxT(t), parent.ID, at); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Errorf("fork at the child's position: %v, want 400", err)
	}
	fork, err := g.Alice.Fork(ctxT(t), parent.ID, mid)
	if err != nil {
		t.Fatal(err)
	}
	recs := traceRecords(t, g.Alice, fork.ID)
	if got, want := kinds(recs), "meta text request_begin tool_call request_end/completed subagent abort"; got != want {
		t.Fatalf("fork's Trace = %s\nwant %s", got, want)
	}
	childFork := recs[5].Payload.SessionID
	if childFork == child || childFork == "" {
		t.Fatalf("the fork's pointer names %q, want the child's fork", childFork)
	}
	cf, err := g.Alice.GetSession(ctxT(t), childFork)
	if err != nil || cf.Parent != fork.ID || cf.ForkedFrom == nil || cf.ForkedFrom.SessionID != child || cf.ForkedFrom.Seq != mid {
		t.Fatalf("child fork = %+v, %v; want parent %s, forked from %s at %d", cf, err, fork.ID, child, mid)
	}
	crecs := traceRecords(t, g.Alice, childFork)
	if got, want := kinds(crecs), "meta text request_begin text token_usage request_end/aborted abort"; got != want {
		t.Errorf("child fork's Trace = %s\nwant %s", got, want)
	}
	if crecs[0].Payload.Source != "subagent" || crecs[0].Payload.SessionID != childFork {
		t.Errorf("child fork's head = %+v", crecs[0].Payload.Meta())
	}
}
