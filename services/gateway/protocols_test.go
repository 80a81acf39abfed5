package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// post sends body to the gateway with token ("" for none) and returns the
// status and body; a streaming answer is cut after its head.
func post(t *testing.T, url, token, contentType, body string) (int, http.Header, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp.StatusCode, resp.Header, nil
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func errorCode(t *testing.T, b []byte) string {
	t.Helper()
	var e client.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	return e.Error.Code
}

func TestAGUIRejectsBadInput(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	url := g.URL + "/api/agui"
	tests := []struct {
		name, token, ct, body string
		status                int
		code, msg             string
	}{
		{"no token", "", "application/json", `{"threadId":"t","runId":"r","messages":[]}`, 401, omni.CodeUnauthorized, ""},
		{"not json content", aliceToken, "text/plain", `{}`, 415, omni.CodeUnsupportedMedia, ""},
		{"malformed json", aliceToken, "application/json", `{"threadId":`, 400, omni.CodeBadRequest, ""},
		{"no threadId", aliceToken, "application/json", `{"runId":"r","messages":[]}`, 400, omni.CodeBadRequest, "threadId is missing"},
		{"messages not an array", aliceToken, "application/json", `{"threadId":"t","runId":"r","messages":"hi"}`, 400, omni.CodeBadRequest, "messages is not an array"},
		{"bad resume", aliceToken, "application/json", `{"threadId":"t","runId":"r","messages":[],"resume":[{"interruptId":"c","status":"later"}]}`, 400, omni.CodeBadRequest, "resolved or cancelled"},
		{"nothing to run", aliceToken, "application/json", `{"threadId":"t-empty","runId":"r","messages":[{"id":"a","role":"assistant","content":"hi"}]}`, 400, omni.CodeBadRequest, "no new user message"},
	}
	for _, tt := range tests {
		status, _, body := post(t, url, tt.token, tt.ct, tt.body)
		if status != tt.status || errorCode(t, body) != tt.code || !strings.Contains(string(body), tt.msg) {
			t.Errorf("%s: %d %s, want %d %s with %q", tt.name, status, body, tt.status, tt.code, tt.msg)
		}
	}
}

func TestAGUIThreadsAreTheirCallersSessions(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	ctx := ctxT(t)
	url := g.URL + "/api/agui"
	run := func(token, thread, runID string) int {
		status, h, _ := post(t, url, token, "application/json",
			`{"threadId":"`+thread+`","runId":"`+runID+`","messages":[{"id":"u1","role":"user","content":"hello"}]}`)
		if status == 200 && !strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("run answered %d with %s, want an event stream", status, h.Get("Content-Type"))
		}
		return status
	}
	// A new thread id makes a Session of alice's, bound to it.
	if st := run(aliceToken, "5f0e7a9c-thread", "run-1"); st != 200 {
		t.Fatalf("alice's first run: %d", st)
	}
	list, err := g.Alice.ListSessions(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("alice's sessions after a run on a new thread: %v, %v; want one", list, err)
	}
	sid := list[0].ID
	if list[0].State != omni.StateRunning {
		t.Errorf("the thread Session is %s, want running (its Task queued)", list[0].State)
	}
	// Bob sees neither the bound thread nor alice's Session by its id.
	if st := run(bobToken, "5f0e7a9c-thread", "run-b"); st != 404 {
		t.Errorf("bob on alice's thread: %d, want 404", st)
	}
	if st := run(bobToken, sid, "run-b2"); st != 404 {
		t.Errorf("bob on alice's session id: %d, want 404", st)
	}
	// The same thread again while its Task runs: 409, nothing queued twice.
	if st := run(aliceToken, "5f0e7a9c-thread", "run-2"); st != 409 {
		t.Errorf("a second run while the first runs: %d, want 409", st)
	}
	// Replays: the run exists for alice, not for bob; an unknown run is 404.
	get := func(token, path string) int {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, g.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := get(aliceToken, "/api/agui/5f0e7a9c-thread/run-1"); st != 200 {
		t.Errorf("alice replays her run: %d", st)
	}
	if st := get(bobToken, "/api/agui/5f0e7a9c-thread/run-1"); st != 404 {
		t.Errorf("bob replays alice's run: %d, want 404", st)
	}
	if st := get(aliceToken, "/api/agui/5f0e7a9c-thread/run-x"); st != 404 {
		t.Errorf("an unknown run: %d, want 404", st)
	}
	// Once the run's messages have left the stream, its replay is gone,
	// said as such (not a stream that waits for a start it cannot see).
	stream, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.Publish(ctx, omni.SessionSubject(sid, omni.ClassServer), []byte(`{"type":"task_state","state":"running"}`)); err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if st := get(aliceToken, "/api/agui/5f0e7a9c-thread/run-1"); st != http.StatusGone {
		t.Errorf("a run past retention: %d, want 410", st)
	}
}

type rpcReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func rpc(t *testing.T, url, token, body string) rpcReply {
	t.Helper()
	status, _, b := post(t, url+"/a2a", token, "application/json", body)
	if status != 200 {
		t.Fatalf("POST /a2a %s: %d %s", body, status, b)
	}
	var r rpcReply
	if err := json.Unmarshal(b, &r); err != nil || r.JSONRPC != "2.0" {
		t.Fatalf("POST /a2a %s: answer %s is not a JSON-RPC response: %v", body, b, err)
	}
	return r
}

func TestA2AAnswersJSONRPCErrors(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	tests := []struct {
		name, body string
		code       int
		id         string
	}{
		{"parse error", `{"jsonrpc":"2.0",`, -32700, "null"},
		{"not a request", `{"jsonrpc":"2.0","id":1}`, -32600, "1"},
		{"unknown method", `{"jsonrpc":"2.0","id":2,"method":"tasks/frobnicate","params":{}}`, -32601, "2"},
		{"unsupported method", `{"jsonrpc":"2.0","id":3,"method":"CreateTaskPushNotificationConfig","params":{}}`, -32004, "3"},
		{"no params", `{"jsonrpc":"2.0","id":4,"method":"GetTask"}`, -32602, "4"},
		{"params of the wrong shape", `{"jsonrpc":"2.0","id":5,"method":"SendMessage","params":{"message":"hi"}}`, -32602, "5"},
		{"no message id", `{"jsonrpc":"2.0","id":6,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","parts":[{"text":"x"}]}}}`, -32602, "6"},
		{"unknown task", `{"jsonrpc":"2.0","id":"a","method":"GetTask","params":{"id":"task-nope"}}`, -32001, `"a"`},
		{"cancel an unknown task", `{"jsonrpc":"2.0","id":7,"method":"CancelTask","params":{"id":"task-nope"}}`, -32001, "7"},
		{"subscribe to an unknown task", `{"jsonrpc":"2.0","id":8,"method":"SubscribeToTask","params":{"id":"task-nope"}}`, -32001, "8"},
		{"unknown context", `{"jsonrpc":"2.0","id":9,"method":"SendMessage","params":{"message":{"messageId":"m","contextId":"ctx-unknown","role":"ROLE_USER","parts":[{"text":"x"}]}}}`, -32602, "9"},
		{"a file part", `{"jsonrpc":"2.0","id":10,"method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"url":"http://x/a.pdf","mediaType":"application/pdf"}]}}}`, -32005, "10"},
	}
	for _, tt := range tests {
		r := rpc(t, g.URL, aliceToken, tt.body)
		if r.Error == nil || r.Error.Code != tt.code || string(r.ID) != tt.id || r.Result != nil {
			t.Errorf("%s: %+v (error %+v), want error %d with id %s", tt.name, r, r.Error, tt.code, tt.id)
		}
	}
	if status, _, _ := post(t, g.URL+"/a2a", "", "application/json", `{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}`); status != 401 {
		t.Errorf("A2A without a token: %d, want 401", status)
	}
}

func TestA2ATasksAreTheirCallersAndTheCardIsPublic(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	r := rpc(t, g.URL, aliceToken, `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"hello"}]},"configuration":{"returnImmediately":true}}}`)
	var res struct {
		Task struct {
			ID, ContextID string
			Status        struct{ State string }
		}
	}
	if r.Error != nil || json.Unmarshal(r.Result, &res) != nil || res.Task.ID == "" || res.Task.ContextID == "" {
		t.Fatalf("SendMessage: %+v %s", r.Error, r.Result)
	}
	if res.Task.Status.State != "TASK_STATE_SUBMITTED" {
		t.Errorf("a queued task is %s, want TASK_STATE_SUBMITTED", res.Task.Status.State)
	}
	get := `{"jsonrpc":"2.0","id":2,"method":"GetTask","params":{"id":"` + res.Task.ID + `"}}`
	if r := rpc(t, g.URL, aliceToken, get); r.Error != nil {
		t.Errorf("alice gets her task: %+v", r.Error)
	}
	if r := rpc(t, g.URL, bobToken, get); r.Error == nil || r.Error.Code != -32001 {
		t.Errorf("bob gets alice's task: %s %+v, want -32001", r.Result, r.Error)
	}
	// A message in alice's context while its Task is queued.
	again := `{"jsonrpc":"2.0","id":3,"method":"SendMessage","params":{"message":{"messageId":"m2","contextId":"` + res.Task.ContextID + `","role":"ROLE_USER","parts":[{"text":"more"}]},"configuration":{"returnImmediately":true}}}`
	if r := rpc(t, g.URL, bobToken, again); r.Error == nil || r.Error.Code != -32602 {
		t.Errorf("bob writes in alice's context: %+v, want -32602 (unknown context)", r.Error)
	}
	if r := rpc(t, g.URL, aliceToken, again); r.Error == nil || r.Error.Code != -32004 {
		t.Errorf("alice writes in her busy context: %+v, want -32004", r.Error)
	}

	// The card: no token needed, the interface URL absolute, bearer declared.
	card := func(url string) map[string]any {
		resp, err := http.Get(url + "/.well-known/agent-card.json")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var c map[string]any
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&c) != nil {
			t.Fatalf("agent card: %d", resp.StatusCode)
		}
		return c
	}
	c := card(g.URL)
	ifs, _ := c["supportedInterfaces"].([]any)
	if len(ifs) != 1 {
		t.Fatalf("card interfaces: %v", c["supportedInterfaces"])
	}
	in := ifs[0].(map[string]any)
	if in["url"] != g.URL+"/a2a" || in["protocolBinding"] != "JSONRPC" || in["protocolVersion"] != "1.0" {
		t.Errorf("card interface = %v, want JSONRPC 1.0 at %s/a2a", in, g.URL)
	}
	if caps, _ := c["capabilities"].(map[string]any); caps["streaming"] != true {
		t.Errorf("card capabilities = %v, want streaming", c["capabilities"])
	}
	if _, ok := c["securitySchemes"].(map[string]any)["bearer"]; !ok {
		t.Errorf("card security schemes = %v, want bearer", c["securitySchemes"])
	}
	if skills, _ := c["skills"].([]any); len(skills) == 0 {
		t.Errorf("card has no skills")
	}
	pub := startGateway(t, env, "", func(cfg *gateway.Config) { cfg.Tokens = nil; cfg.PublicURL = "https://floe.example.com/" })
	c = card(pub.URL)
	if u := c["supportedInterfaces"].([]any)[0].(map[string]any)["url"]; u != "https://floe.example.com/a2a" {
		t.Errorf("card URL with PublicURL = %v", u)
	}
	if _, ok := c["securitySchemes"]; ok {
		t.Errorf("a card without tokens declares security: %v", c["securitySchemes"])
	}
}
