package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
)

// This file holds the helpers of the reconnect_*_test.go files: a fake
// OpenAI-compatible Chat Completions server speaking the wire format
// verbatim (one "data: {chunk}" event per chunk, a usage chunk, then
// "data: [DONE]"), scripted per request, and readers of the Session's
// stream and of the request bodies the engine sent.

const (
	rcAPIKey = "sk-floe-fake"
	rcModel  = "openai:gpt-4o-mini"
	// rcBound bounds every wait of a fake handler.
	rcBound = 30 * time.Second
)

// rcReply answers one Chat Completions request.
type rcReply func(w http.ResponseWriter, r *http.Request)

// rcFake serves POST /v1/chat/completions on 127.0.0.1: the n-th
// request (0-based) is answered by replies[n]; a request beyond the script
// fails the test and gets a 400. Every request body is kept. The engine's
// title requests (engine.TitleInstruction, after a Session's first
// completed Task) are answered rcTitle and counted apart.
type rcFake struct {
	*httptest.Server
	t       testing.TB
	replies []rcReply

	mu     sync.Mutex
	bodies [][]byte
	titles [][]byte
	// titleReply, when set, answers the title requests instead of
	// rcAnswer(rcTitle).
	titleReply rcReply
	// arrived gets the index of each request as it arrives.
	arrived chan int
}

func rcNewFake(t testing.TB, replies ...rcReply) *rcFake {
	t.Helper()
	f := &rcFake{t: t, replies: replies, arrived: make(chan int, 64)}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

// baseURL is what OPENAI_BASE_URL would hold: the API root with its version.
func (f *rcFake) baseURL() string { return f.URL + "/v1" }

func (f *rcFake) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		f.t.Errorf("fake: unexpected %s %s", r.Method, r.URL.Path)
		http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
		return
	}
	if got := r.Header.Get("Authorization"); got != "Bearer "+rcAPIKey {
		f.t.Errorf("fake: Authorization = %q", got)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		f.t.Errorf("fake: reading body: %v", err)
		return
	}
	if rcIsTitle(body) {
		f.mu.Lock()
		f.titles = append(f.titles, body)
		reply := f.titleReply
		f.mu.Unlock()
		if reply == nil {
			reply = rcAnswer(rcTitle)
		}
		reply(w, r)
		return
	}
	f.mu.Lock()
	n := len(f.bodies)
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	select {
	case f.arrived <- n:
	default:
	}
	if n >= len(f.replies) {
		f.t.Errorf("fake: unexpected request %d (script has %d)", n+1, len(f.replies))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":"fake: no reply scripted for request %d","type":"invalid_request_error"}}`, n+1)
		return
	}
	f.replies[n](w, r)
}

// rcTitle is the fake's answer to a title request.
const rcTitle = "Fake model title"

// rcIsTitle reports whether body is the engine's title request.
func rcIsTitle(body []byte) bool {
	var req rcSentRequest
	if json.Unmarshal(body, &req) != nil || len(req.Messages) != 1 {
		return false
	}
	return strings.HasPrefix(req.Messages[0].text(), engine.TitleInstruction)
}

// titleRequests returns the bodies of the title requests so far.
func (f *rcFake) titleRequests() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.titles)
}

// requests returns how many requests (title requests aside) arrived so far.
func (f *rcFake) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

// body returns request i's decoded body.
func (f *rcFake) body(i int) rcSentRequest {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.bodies) {
		f.t.Fatalf("request %d never arrived (%d did)", i+1, len(f.bodies))
	}
	var req rcSentRequest
	if err := json.Unmarshal(f.bodies[i], &req); err != nil {
		f.t.Fatalf("request %d: body is not JSON: %v: %s", i+1, err, f.bodies[i])
	}
	return req
}

// rcSentRequest is the part of a Chat Completions request body the tests read.
type rcSentRequest struct {
	Model    string          `json:"model"`
	Stream   bool            `json:"stream"`
	Messages []rcSentMessage `json:"messages"`
}

type rcSentMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent *string         `json:"reasoning_content"`
	ToolCalls        []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
	ToolCallID string `json:"tool_call_id"`
}

// text is a message's content when it is a string ("" otherwise).
func (m rcSentMessage) text() string {
	var s string
	_ = json.Unmarshal(m.Content, &s)
	return s
}

// retriedBlocks returns the text of every user message holding a
// [turn_retried] block.
func (r rcSentRequest) retriedBlocks() []string {
	var out []string
	for _, m := range r.Messages {
		if m.Role == "user" && strings.Contains(m.text(), "["+omni.TagTurnRetried+"]") {
			out = append(out, m.text())
		}
	}
	return out
}

// Wire chunks, shaped as api.openai.com streams them.

const rcChunkHead = `{"id":"chatcmpl-fake","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_fake","choices":[{"index":0,"delta":`

func rcQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func rcDeltaChunk(delta string) string {
	return rcChunkHead + delta + `,"logprobs":null,"finish_reason":null}],"usage":null}`
}

func rcRoleChunk() string          { return rcDeltaChunk(`{"role":"assistant","content":"","refusal":null}`) }
func rcTextChunk(s string) string  { return rcDeltaChunk(`{"content":` + rcQuote(s) + `}`) }
func rcThinkChunk(s string) string { return rcDeltaChunk(`{"reasoning_content":` + rcQuote(s) + `}`) }
func rcFinishChunk(why string) string {
	return rcChunkHead + `{},"logprobs":null,"finish_reason":"` + why + `"}],"usage":null}`
}

func rcUsageChunk(prompt, completion int) string {
	return fmt.Sprintf(`{"id":"chatcmpl-fake","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_fake","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}}`,
		prompt, completion, prompt+completion)
}

// rcToolStartChunk opens call index with its id, name and first argument fragment.
func rcToolStartChunk(index int, id, name, args string) string {
	return rcDeltaChunk(fmt.Sprintf(`{"tool_calls":[{"index":%d,"id":%q,"type":"function","function":{"name":%q,"arguments":%s}}]}`, index, id, name, rcQuote(args)))
}

// rcToolArgsChunk continues call index's arguments.
func rcToolArgsChunk(index int, args string) string {
	return rcDeltaChunk(fmt.Sprintf(`{"tool_calls":[{"index":%d,"function":{"arguments":%s}}]}`, index, rcQuote(args)))
}

// rcExecArgs is exec_command's arguments JSON for cmd.
func rcExecArgs(desc, cmd string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // as models write it: "echo x >> f", not \u003e
	_ = enc.Encode(struct {
		Description string `json:"description"`
		Cmd         string `json:"cmd"`
	}{desc, cmd})
	return strings.TrimSuffix(b.String(), "\n")
}

// rcTextTurn is a complete streamed answer: the text in two chunks, the
// finish chunk and the usage chunk ([DONE] is added by rcStreamed).
func rcTextTurn(text string) []string {
	half := len(text) / 2
	return []string{rcRoleChunk(), rcTextChunk(text[:half]), rcTextChunk(text[half:]), rcFinishChunk("stop"), rcUsageChunk(120, 7)}
}

// Replies.

func rcWriteEvents(w http.ResponseWriter, chunks []string) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	for _, c := range chunks {
		fmt.Fprintf(w, "data: %s\n\n", c)
		fl.Flush()
	}
}

// rcStreamed answers with chunks then "data: [DONE]".
func rcStreamed(chunks ...string) rcReply {
	return func(w http.ResponseWriter, r *http.Request) {
		rcWriteEvents(w, chunks)
		fmt.Fprint(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
	}
}

// rcAnswer streams a complete text answer.
func rcAnswer(text string) rcReply { return rcStreamed(rcTextTurn(text)...) }

// rcDropAfter streams chunks, then drops the connection (no [DONE]).
func rcDropAfter(chunks ...string) rcReply {
	return func(w http.ResponseWriter, r *http.Request) {
		rcWriteEvents(w, chunks)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}
}

// rcReject answers with an HTTP error and a JSON body.
func rcReject(code int, body string, header ...string) rcReply {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprint(w, body)
	}
}

const (
	rcBody500 = `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`
	rcBody401 = `{"error":{"message":"Incorrect API key provided: sk-floe-***ake. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`
	rcBody429 = `{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-fake on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
)

// rcStall sends nothing until the client goes away (or rcBound). The body
// is drained first: only then does net/http watch the connection and end
// r.Context() when the client leaves.
func rcStall() rcReply {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(rcBound):
		}
	}
}

// rcHeld waits until release is closed (or the client leaves), then answers
// with then.
func rcHeld(release <-chan struct{}, then rcReply) rcReply {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-release:
			then(w, r)
		case <-r.Context().Done():
		case <-time.After(rcBound):
		}
	}
}

// Engine and stream helpers.

// rcEnv starts the stack with the engine pointed at f, a fast ladder
// (30 ms base, 120 ms cap, 5 reconnects) and tweak applied last.
func rcEnv(t *testing.T, f *rcFake, tweak func(*engine.Config)) *env {
	t.Helper()
	return start(t, envOpts{engine: func(c *engine.Config) {
		c.Providers.OpenAIBaseURL = f.baseURL()
		c.Providers.OpenAIAPIKey = rcAPIKey
		c.RetryBase, c.RetryCap, c.RetryMax = 30*time.Millisecond, 120*time.Millisecond, 5
		if tweak != nil {
			tweak(c)
		}
	}})
}

// rcPayloads returns the payloads of the messages of type typ, in order.
func rcPayloads(rs []rec, typ string) []omni.Payload {
	var out []omni.Payload
	for _, r := range rs {
		if r.class != omni.ClassServer && r.msg.Payload.Type == typ {
			out = append(out, r.msg.Payload)
		}
	}
	return out
}

func rcDescribeEnds(ends []omni.Payload) string {
	var b strings.Builder
	for i, e := range ends {
		fmt.Fprintf(&b, "\n  %d: status=%s attempt=%d retry_in_ms=%d error=%q", i+1, e.Status, e.Attempt, e.RetryInMs, e.ErrorMessage)
	}
	return b.String()
}

// rcFromFirstBegin drops everything before the first request_begin.
func rcFromFirstBegin(ls []string) []string {
	if i := indexOf(ls, "request_begin"); i >= 0 {
		return ls[i:]
	}
	return nil
}

// rcWaitFor follows the Session's stream from the start until a message
// satisfies pred and returns it.
func rcWaitFor(e *env, sid, what string, pred func(rec) bool) rec {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rcBound)
	defer cancel()
	var found *rec
	err := bus.FollowUntil(ctx, e.st.JS, sid, nil, 0, false, func(sm bus.StreamMsg) error {
		r := rec{seq: sm.Seq, class: sm.Class, raw: append([]byte(nil), sm.Data...)}
		if sm.Class == omni.ClassServer {
			_ = json.Unmarshal(sm.Data, &r.ev)
		} else if m, err := omni.Decode(sm.Data); err == nil {
			r.msg = m
		}
		if pred(r) {
			found = &r
			return bus.ErrStop
		}
		return nil
	})
	if err != nil || found == nil {
		e.t.Fatalf("waiting for %s: %v", what, err)
	}
	return *found
}

// rcControl sends a control request to the Session's running Task.
func rcControl(e *env, sid, verb string, c omni.Control) omni.ControlReply {
	e.t.Helper()
	b, err := omni.Pack(&c)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := e.st.Conn.Request(omni.ControlSubject(sid, verb), b, 10*time.Second)
	if err != nil {
		e.t.Fatalf("control %s: %v", verb, err)
	}
	var rep omni.ControlReply
	if err := omni.Unpack(m.Data, &rep); err != nil {
		e.t.Fatalf("control %s rcReply: %v", verb, err)
	}
	return rep
}

// rcTrace waits until the tracer has written everything up to the
// Session's last Trace-class message and returns the Trace records, and
// the Trace-class messages of the stream (origin-less, in order) they must
// equal byte for byte.
func rcTrace(e *env, sid string) (lines [][]byte, stream [][]byte) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rcBound)
	defer cancel()
	var last uint64
	err := bus.FollowUntil(ctx, e.st.JS, sid, omni.TraceClasses, 0, true, func(sm bus.StreamMsg) error {
		m, err := omni.Decode(sm.Data)
		if err != nil {
			e.t.Fatalf("seq %d: %v", sm.Seq, err)
		}
		if len(m.Origin) == 0 {
			stream = append(stream, append([]byte(nil), sm.Data...))
		}
		last = sm.Seq
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	var pos trace.Pos
	eventually(e.t, rcBound, "the tracer to catch up", func() bool {
		p, ok, err := trace.ReadPos(e.home, sid)
		pos = p
		return err == nil && ok && p.Seq >= last
	})
	data, err := os.ReadFile(pos.File)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, skipped, err := trace.Read(bytes.NewReader(data)); err != nil || len(skipped) > 0 {
		e.t.Fatalf("ReadTrace: %v, skipped %v", err, skipped)
	}
	return bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")), stream
}
