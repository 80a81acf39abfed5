package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
	"floe.dev/services/tracer"
)

// raw sends a request and returns the status and decoded error code.
func raw(t *testing.T, method, url, token, contentType string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb client.ErrorBody
	json.Unmarshal(b, &eb)
	if resp.StatusCode >= 400 && (eb.Error.Code == "" || eb.Error.Message == "") {
		t.Fatalf("%s %s: %d with body %q, want the error shape", method, url, resp.StatusCode, b)
	}
	return resp.StatusCode, eb.Error.Code
}

func TestBadInputGetsDocumentedStatusAndCode(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", func(c *gateway.Config) { c.MaxBody = 4096 })
	sess := createSession(t, g.Alice, client.CreateSession{})
	base := g.URL + "/api/sessions/" + sess.ID
	const js = "application/json"
	big := []byte(`{"input":[{"type":"text","text":"` + strings.Repeat("a", 5000) + `"}]}`)
	tests := []struct {
		name         string
		method, url  string
		token, ctype string
		body         string
		rawBody      []byte
		status       int
		code         string
	}{
		{"missing token", "GET", g.URL + "/api/sessions", "", "", "", nil, 401, omni.CodeUnauthorized},
		{"wrong token", "GET", g.URL + "/api/sessions", "nope", "", "", nil, 401, omni.CodeUnauthorized},
		{"healthz is open", "GET", g.URL + "/healthz", "", "", "", nil, 200, ""},
		{"malformed JSON", "POST", base + "/tasks", aliceToken, js, `{"input":[`, nil, 400, omni.CodeBadRequest},
		{"trailing data", "POST", base + "/tasks", aliceToken, js, `{"input":[{"type":"text","text":"a"}]} {}`, nil, 400, omni.CodeBadRequest},
		{"wrong content type", "POST", base + "/tasks", aliceToken, "text/plain", `{"input":[{"type":"text","text":"a"}]}`, nil, 415, omni.CodeUnsupportedMedia},
		{"no content type", "POST", base + "/tasks", aliceToken, "", `{"input":[{"type":"text","text":"a"}]}`, nil, 415, omni.CodeUnsupportedMedia},
		{"oversized body", "POST", base + "/tasks", aliceToken, js, "", big, 413, omni.CodeTooLarge},
		{"unknown field", "POST", base + "/tasks", aliceToken, js, `{"input":[{"type":"text","text":"a"}],"bogus":1}`, nil, 400, omni.CodeBadRequest},
		{"unknown nested field", "POST", base + "/tasks", aliceToken, js, `{"input":[{"type":"text","text":"a","x":1}]}`, nil, 400, omni.CodeBadRequest},
		{"wrong field type", "POST", base + "/tasks", aliceToken, js, `{"input":"hello"}`, nil, 400, omni.CodeBadRequest},
		{"empty input", "POST", base + "/tasks", aliceToken, js, `{"input":[]}`, nil, 400, omni.CodeBadRequest},
		{"bad part type", "POST", base + "/tasks", aliceToken, js, `{"input":[{"type":"video","text":"a"}]}`, nil, 400, omni.CodeBadRequest},
		{"empty body", "POST", base + "/tasks", aliceToken, js, ``, nil, 400, omni.CodeBadRequest},
		{"unknown session", "POST", g.URL + "/api/sessions/session-2026-01-01-00-00-00-00000000/tasks", aliceToken, js, `{"input":[{"type":"text","text":"a"}]}`, nil, 404, omni.CodeNotFound},
		{"invalid session id", "GET", g.URL + "/api/sessions/a.b", aliceToken, "", "", nil, 404, omni.CodeNotFound},
		{"another principal's session", "GET", base, bobToken, "", "", nil, 404, omni.CodeNotFound},
		{"another principal's stream", "GET", base + "/stream", bobToken, "", "", nil, 404, omni.CodeNotFound},
		{"another principal's task", "POST", base + "/tasks", bobToken, js, `{"input":[{"type":"text","text":"a"}]}`, nil, 404, omni.CodeNotFound},
		{"invalid decision", "POST", base + "/approvals/call-1", aliceToken, js, `{"decision":"maybe"}`, nil, 400, omni.CodeBadRequest},
		{"approval with nothing pending", "POST", base + "/approvals/call-1", aliceToken, js, `{"decision":"allow"}`, nil, 404, omni.CodeNotFound},
		{"bad approval mode", "POST", g.URL + "/api/sessions", aliceToken, js, `{"approvalMode":"yolo"}`, nil, 400, omni.CodeBadRequest},
		{"bad model", "POST", g.URL + "/api/sessions", aliceToken, js, `{"model":"gpt"}`, nil, 400, omni.CodeBadRequest},
		{"relative workspace", "POST", g.URL + "/api/sessions", aliceToken, js, `{"workspace":"rel/dir"}`, nil, 400, omni.CodeBadRequest},
		{"bad compaction mode", "POST", g.URL + "/api/sessions", aliceToken, js, `{"compaction":{"mode":"zip"}}`, nil, 400, omni.CodeBadRequest},
		{"bad patch", "PATCH", base, aliceToken, js, `{"approvalMode":"nope"}`, nil, 400, omni.CodeBadRequest},
		{"patch unknown field", "PATCH", base, aliceToken, js, `{"model":"x:y"}`, nil, 400, omni.CodeBadRequest},
		{"steer without text", "POST", base + "/steer", aliceToken, js, `{"text":""}`, nil, 400, omni.CodeBadRequest},
		{"steer when idle", "POST", base + "/steer", aliceToken, js, `{"text":"go left"}`, nil, 409, omni.CodeNotRunning},
		{"compact a new session", "POST", base + "/compact", aliceToken, js, "", nil, 409, omni.CodeNothingToCompact},
		{"compact without content type", "POST", base + "/compact", aliceToken, "", "", nil, 415, omni.CodeUnsupportedMedia},
		{"abort without content type", "POST", base + "/abort", aliceToken, "", "", nil, 415, omni.CodeUnsupportedMedia},
		{"create without body or type", "POST", g.URL + "/api/sessions", aliceToken, "", "", nil, 415, omni.CodeUnsupportedMedia},
		{"create as a form", "POST", g.URL + "/api/sessions", aliceToken, "text/plain", "", nil, 415, omni.CodeUnsupportedMedia},
		{"missing trace", "GET", base + "/traces/1", aliceToken, "", "", nil, 404, omni.CodeNotFound},
		{"bad trace index", "GET", base + "/traces/x", aliceToken, "", "", nil, 404, omni.CodeNotFound},
		{"unknown route", "GET", g.URL + "/api/nope", aliceToken, "", "", nil, 404, omni.CodeNotFound},
		// An empty id is a path no route takes, whatever the mux would
		// clean it into (before: 405 for the Session "fork").
		{"fork without an id", "POST", g.URL + "/api/sessions//fork", aliceToken, js, `{}`, nil, 404, omni.CodeNotFound},
		{"task without an id", "POST", g.URL + "/api/sessions//tasks", aliceToken, js, `{"input":[{"type":"text","text":"a"}]}`, nil, 404, omni.CodeNotFound},
		{"abort without an id", "POST", g.URL + "/api/sessions//abort", aliceToken, js, "", nil, 404, omni.CodeNotFound},
		{"messages without an id", "GET", g.URL + "/api/sessions//messages", aliceToken, "", "", nil, 404, omni.CodeNotFound},
		{"a dot segment", "GET", base + "/../" + sess.ID, aliceToken, "", "", nil, 404, omni.CodeNotFound},
		{"wrong method", "PUT", base, aliceToken, js, `{}`, nil, 405, omni.CodeBadRequest},
		{"retry-now when idle", "POST", base + "/retry-now", aliceToken, js, "", nil, 200, ""},
		{"abort when idle", "POST", base + "/abort", aliceToken, js, "", nil, 204, ""},
	}
	for _, tt := range tests {
		body := tt.rawBody
		if body == nil {
			body = []byte(tt.body)
		}
		status, code := raw(t, tt.method, tt.url, tt.token, tt.ctype, body)
		if status != tt.status || code != tt.code {
			t.Errorf("%s: %s %s = %d %q, want %d %q", tt.name, tt.method, tt.url, status, code, tt.status, tt.code)
		}
	}
	// Still serving after all of it.
	if _, err := g.Alice.GetSession(ctxT(t), sess.ID); err != nil {
		t.Fatalf("get after bad input: %v", err)
	}
}

func TestSessionLifecycle(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	startEngine(t, env, nil)
	g := startGateway(t, env, "", func(c *gateway.Config) { c.DefaultModel = "scripted:test" })
	ctx := ctxT(t)

	s := createSession(t, g.Alice, client.CreateSession{Title: "first"})
	if s.Model != "scripted:test" || s.ApprovalMode != omni.ApproveAllowAll || s.State != omni.StateIdle ||
		s.Workspace != filepath.Join(g.Home, "workspaces", s.ID) || !strings.HasPrefix(s.ID, "session-") {
		t.Fatalf("created %+v, want defaults", s)
	}
	if _, ok := omni.SessionCreated(s.ID); !ok {
		t.Fatalf("id %q does not encode its creation time", s.ID)
	}
	if fi, err := os.Stat(s.Workspace); err != nil || !fi.IsDir() {
		t.Fatalf("workspace not created: %v", err)
	}
	ws := filepath.Join(g.Home, "workspaces", "project") // inside a default root
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	s2 := createSession(t, g.Alice, client.CreateSession{Model: "openai:gpt-x", Workspace: ws, ApprovalMode: omni.ApproveReadOnly,
		SystemPrompt: "be brief", MaxTurns: 7, Compaction: &client.Compaction{MaxContextLength: 1000, Mode: "discard"}})
	if s2.Workspace != ws || s2.Model != "openai:gpt-x" || s2.MaxTurns != 7 || s2.Compaction == nil || s2.Compaction.Mode != "discard" {
		t.Fatalf("created %+v", s2)
	}
	rec, _, err := env.Sessions.Get(ctx, s2.ID)
	if err != nil || rec.Principal != "alice" || rec.SystemPrompt != "be brief" || rec.ApprovalMode != omni.ApproveReadOnly {
		t.Fatalf("record %+v (%v)", rec, err)
	}
	bobs := createSession(t, g.Bob, client.CreateSession{})

	list, err := g.Alice.ListSessions(ctx)
	if err != nil || len(list) != 2 || list[0].ID != s.ID || list[1].ID != s2.ID {
		t.Fatalf("alice's list = %+v (%v), want her two sessions", list, err)
	}
	if list, _ := g.Bob.ListSessions(ctx); len(list) != 1 || list[0].ID != bobs.ID {
		t.Fatalf("bob's list = %+v", list)
	}

	mode, title := omni.ApproveAlwaysAsk, "renamed"
	p, err := g.Alice.PatchSession(ctx, s.ID, client.SessionPatch{ApprovalMode: &mode, Title: &title})
	if err != nil || p.ApprovalMode != mode || p.Title != title {
		t.Fatalf("patch = %+v (%v)", p, err)
	}
	if _, err := g.Bob.PatchSession(ctx, s.ID, client.SessionPatch{Title: &title}); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("bob patching alice's session: %v, want 404", err)
	}
	if err := g.Bob.DeleteSession(ctx, s.ID); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("bob deleting alice's session: %v, want 404", err)
	}

	// Give the Session messages and Trace files, then delete it.
	submit(t, g.Alice, s.ID, "hello")
	waitIdle(t, env, s.ID)
	created, _ := omni.SessionCreated(s.ID)
	tracePath := trace.File(g.Home, created, s.ID, 1)
	os.MkdirAll(filepath.Dir(tracePath), 0o755)
	os.WriteFile(tracePath, []byte("{}\n"), 0o644)
	if err := trace.WritePos(g.Home, s.ID, trace.Pos{File: tracePath, Size: 3, Index: 1, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if n := len(busStream(t, env, s.ID)); n == 0 {
		t.Fatal("no messages on the bus before delete")
	}
	other := len(busStream(t, env, s2.ID))
	// Only the tracer deletes Trace files: with none running, the DELETE
	// fails (503, after asking for 10 s) and leaves the Trace; the record
	// stays marked deleted.
	if err := g.Alice.DeleteSession(ctx, s.ID); !client.IsCode(err, omni.CodeUnavailable) {
		t.Fatalf("delete without a tracer: %v, want 503 unavailable", err)
	}
	if _, err := os.Stat(tracePath); err != nil {
		t.Fatalf("trace file removed without the tracer: %v", err)
	}
	if rec, _, err := env.Sessions.Get(ctx, s.ID); err != nil || !rec.Deleted {
		t.Fatalf("record after a failed delete = %+v, %v; want it marked deleted", rec, err)
	}
	// A DELETE asks again while no tracer listens: one that starts
	// meanwhile (a restart, a service starting) answers it.
	deleted := make(chan error, 1)
	go func() { deleted <- g.Alice.DeleteSession(ctx, s.ID) }()
	time.Sleep(500 * time.Millisecond) // the DELETE's first ask finds no tracer
	tctx, stopTracer := context.WithCancel(context.Background())
	tracerDone := make(chan error, 1)
	tcfg := tracer.DefaultConfig()
	tcfg.Home = g.Home
	go func() { tracerDone <- tracer.Run(tctx, env.Conn, tcfg, zerolog.Nop()) }()
	defer func() { stopTracer(); <-tracerDone }()
	if err := <-deleted; err != nil {
		t.Fatalf("a DELETE while the tracer was starting: %v, want it answered", err)
	}
	if _, err := g.Alice.GetSession(ctx, s.ID); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("get after delete: %v, want 404", err)
	}
	if _, err := os.Stat(tracePath); !os.IsNotExist(err) {
		t.Fatalf("trace file still there: %v", err)
	}
	if _, ok, err := trace.ReadPos(g.Home, s.ID); ok || err != nil {
		t.Fatalf("trace position still there: %v, %v", ok, err)
	}
	stream, _ := env.JS.Stream(ctx, omni.SessionsStream)
	if _, err := stream.GetLastMsgForSubject(ctx, omni.SessionWildcard(s.ID)); err != jetstream.ErrMsgNotFound {
		t.Fatalf("session messages not purged: %v", err)
	}
	if n := len(busStream(t, env, s2.ID)); n != other {
		t.Fatalf("other session lost messages: %d, want %d", n, other)
	}
	if err := g.Alice.DeleteSession(ctx, s.ID); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("second delete: %v, want 404", err)
	}
}

func TestDeleteAndCompactWhileRunningConflict(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g1 := newGate(1)
	startEngine(t, env, func(e *fakeEngine) { e.Hold = g1.hold })
	g := startGateway(t, env, "", nil)
	startTracer(t, env, g.Home) // deletes (and purges) the Session at the end
	ctx := ctxT(t)
	s := createSession(t, g.Alice, client.CreateSession{})
	submit(t, g.Alice, s.ID, "hi")
	g1.waitReached(t)
	if err := g.Alice.DeleteSession(ctx, s.ID); !client.IsCode(err, omni.CodeTaskInProgress) {
		t.Fatalf("delete while running: %v, want 409 task_in_progress", err)
	}
	if _, err := g.Alice.Compact(ctx, s.ID); !client.IsCode(err, omni.CodeTaskInProgress) {
		t.Fatalf("compact while running: %v, want 409 task_in_progress", err)
	}
	if _, err := g.Alice.SubmitTask(ctx, s.ID, client.TaskRequest{Input: []client.InputPart{{Type: "text", Text: "again"}}}); !client.IsCode(err, omni.CodeTaskInProgress) {
		t.Fatalf("second task: %v, want 409 task_in_progress", err)
	}
	// PATCH works while running.
	mode := omni.ApproveDenyAll
	if _, err := g.Alice.PatchSession(ctx, s.ID, client.SessionPatch{ApprovalMode: &mode}); err != nil {
		t.Fatalf("patch while running: %v", err)
	}
	if err := g.Alice.Steer(ctx, s.ID, "shorter please"); err != nil {
		t.Fatalf("steer: %v", err)
	}
	if skipped, err := g.Alice.RetryNow(ctx, s.ID); err != nil || skipped {
		t.Fatalf("retry-now = %v, %v", skipped, err)
	}
	g1.open()
	waitIdle(t, env, s.ID)

	// Now there is something to compact.
	id, err := g.Alice.Compact(ctx, s.ID)
	if err != nil || id == "" {
		t.Fatalf("compact: %q, %v", id, err)
	}
	waitIdle(t, env, s.ID)
	if err := g.Alice.DeleteSession(ctx, s.ID); err != nil {
		t.Fatalf("delete when idle: %v", err)
	}
}

func TestSteerReachesTheRunningTask(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g1 := newGate(1)
	e := startEngine(t, env, func(e *fakeEngine) { e.Hold = g1.hold })
	g := startGateway(t, env, "", nil)
	s := createSession(t, g.Alice, client.CreateSession{})
	submit(t, g.Alice, s.ID, "hi")
	g1.waitReached(t)
	if err := g.Alice.Steer(ctxT(t), s.ID, "go left"); err != nil {
		t.Fatal(err)
	}
	if got := e.steers(s.ID); len(got) != 1 || got[0] != "go left" {
		t.Fatalf("engine got steers %q", got)
	}
	g1.open()
}

func TestAbort(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g1 := newGate(2)
	startEngine(t, env, func(e *fakeEngine) { e.Hold = g1.hold })
	g := startGateway(t, env, "", nil)
	ctx := ctxT(t)
	s := createSession(t, g.Alice, client.CreateSession{})
	if interrupted, err := g.Alice.Abort(ctx, s.ID); err != nil || interrupted {
		t.Fatalf("abort when idle = %v, %v; want 204", interrupted, err)
	}
	col := openStream(t, g.Alice, s.ID, "")
	submit(t, g.Alice, s.ID, "long answer")
	g1.waitReached(t)
	if interrupted, err := g.Alice.Abort(ctx, s.ID); err != nil || !interrupted {
		t.Fatalf("abort while running = %v, %v; want 202", interrupted, err)
	}
	g1.open()
	col.until("abort event", func(ev client.Event) bool { return payloadType(ev.Data) == omni.TypeAbort })
	end := col.until("end", idleEvent)
	se, _ := serverEvent(end)
	if se.Status != omni.StatusAborted {
		t.Fatalf("task ended %q, want aborted", se.Status)
	}
	got, _ := g.Alice.GetSession(ctx, s.ID)
	if got.State != omni.StateIdle || got.LastStatus != omni.StatusAborted {
		t.Fatalf("session after abort = %+v", got)
	}
}

func TestAbortCancelsATaskNoEngineTakes(t *testing.T) {
	t.Parallel()
	env := newBus(t) // no engine
	g := startGateway(t, env, "", nil)
	ctx := ctxT(t)
	s := createSession(t, g.Alice, client.CreateSession{})
	col := openStream(t, g.Alice, s.ID, "")
	submit(t, g.Alice, s.ID, "nobody hears this")
	start := time.Now()
	if interrupted, err := g.Alice.Abort(ctx, s.ID); err != nil || !interrupted {
		t.Fatalf("abort = %v, %v; want 202", interrupted, err)
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("abort answered after %v, before waiting for an engine", d)
	}
	got, _ := g.Alice.GetSession(ctx, s.ID)
	if got.State != omni.StateIdle || got.LastStatus != omni.StatusAborted {
		t.Fatalf("session after abort = %+v", got)
	}
	tasks, _ := env.JS.Stream(ctx, omni.TasksStream)
	if info, _ := tasks.Info(ctx); info.State.Msgs != 0 {
		t.Fatalf("%d tasks still queued", info.State.Msgs)
	}
	end := col.until("task_state idle", idleEvent)
	if se, _ := serverEvent(end); se.Status != omni.StatusAborted {
		t.Fatalf("end event %s", end.Data)
	}
	// The Session is usable again.
	submit(t, g.Alice, s.ID, "again")
}

func TestConcurrentTasksThroughTwoGatewaysOneWins(t *testing.T) {
	t.Parallel()
	env := newBus(t) // no engine: the winner keeps the Session running
	a := startGateway(t, env, "", nil)
	b := startGateway(t, env, a.Home, nil)
	for round := range 5 {
		s := createSession(t, a.Alice, client.CreateSession{})
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, g := range []*testGateway{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = g.Alice.SubmitTask(ctxT(t), s.ID, client.TaskRequest{Input: []client.InputPart{{Type: "text", Text: "race"}}})
			}()
		}
		wg.Wait()
		ok, conflict := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case client.IsCode(err, omni.CodeTaskInProgress):
				conflict++
			default:
				t.Fatalf("round %d: unexpected error %v", round, err)
			}
		}
		if ok != 1 || conflict != 1 {
			t.Fatalf("round %d: %d accepted, %d conflicts; want exactly one of each", round, ok, conflict)
		}
	}
	tasks, _ := env.JS.Stream(context.Background(), omni.TasksStream)
	if info, _ := tasks.Info(ctxT(t)); info.State.Msgs != 5 {
		t.Fatalf("%d tasks queued, want 5", info.State.Msgs)
	}
}

func TestTracesRoutes(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	ctx := ctxT(t)
	s := createSession(t, g.Alice, client.CreateSession{})
	created, _ := omni.SessionCreated(s.ID)
	meta := omni.SessionMeta(omni.Meta{SessionID: s.ID, Provider: "scripted", ModelID: "demo"})
	line1 := string(omni.MustMarshal(&meta)) + "\n"
	for i, content := range []string{line1, line1 + line1} {
		p := trace.File(g.Home, created, s.ID, i+1)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list, err := g.Alice.Traces(ctx, s.ID)
	if err != nil || len(list) != 2 || list[0].Index != 1 || list[1].Index != 2 ||
		list[0].Size != int64(len(line1)) || list[1].Name != s.ID+"_002.jsonl" {
		t.Fatalf("traces = %+v (%v)", list, err)
	}
	b, err := g.Alice.Trace(ctx, s.ID, 2)
	if err != nil || string(b) != line1+line1 {
		t.Fatalf("trace 2 = %q (%v)", b, err)
	}
	if _, err := g.Alice.Trace(ctx, s.ID, 3); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("trace 3: %v, want 404", err)
	}
	if _, err := g.Bob.Traces(ctx, s.ID); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("bob's traces: %v, want 404", err)
	}
}

func TestMetricsExposition(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	s := createSession(t, g.Alice, client.CreateSession{})
	col := openStream(t, g.Alice, s.ID, "")
	col.next()
	raw(t, "GET", g.URL+"/api/sessions", "", "", nil)
	req, _ := http.NewRequestWithContext(ctxT(t), "GET", g.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	text := string(b)
	for _, want := range []string{
		`floe_gateway_http_requests_total{route="POST /api/sessions",status="201"} 1`,
		`floe_gateway_http_requests_total{route="GET /api/sessions",status="401"} 1`,
		"floe_gateway_sse_clients 1",
		"# TYPE floe_gateway_sse_events_sent_total counter",
		"floe_gateway_sse_events_sent_total 1",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, text)
		}
	}
}
