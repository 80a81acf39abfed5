package openai

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

func chunkJSON(delta string) string {
	return `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}],"usage":null}`
}

func finishJSON(reason string) string {
	return `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{},"finish_reason":"` + reason + `"}],"usage":null}`
}

func usageJSON(prompt, completion, cached int) string {
	b, _ := json.Marshal(map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": []any{},
		"usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
			"prompt_tokens_details": map[string]any{"cached_tokens": cached}}})
	return string(b)
}

func TestStreamTextEmitsDeltasAndEndsAtDone(t *testing.T) {
	srv := newSSEServer(t,
		chunkJSON(`{"role":"assistant","content":""}`),
		chunkJSON(`{"content":"Hel"}`),
		chunkJSON(`{"content":"lo"}`),
		finishJSON("stop"),
		usageJSON(12, 2, 0),
		"[DONE]")
	p := New(Config{BaseURL: srv.URL, APIKey: "sk-test"})
	ds, res, err := stream(t, p, simpleRequest())
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	want := []model.Delta{
		{Block: 0, Type: omni.TypeText, Text: "Hel"},
		{Block: 0, Type: omni.TypeText, Text: "lo"},
		{Block: 0, Type: omni.TypeText, End: true},
	}
	if !reflect.DeepEqual(ds, want) {
		t.Fatalf("deltas = %+v, want %+v", ds, want)
	}
	wantRes := model.Result{Usage: omni.Usage{Output: 2, Total: 14}, StopReason: omni.StatusCompleted}
	if res != wantRes {
		t.Fatalf("result = %+v, want %+v", res, wantRes)
	}
}

func TestStreamReasoningBecomesThinkingWithFieldFidelity(t *testing.T) {
	for _, field := range []string{"reasoning_content", "reasoning"} {
		t.Run(field, func(t *testing.T) {
			srv := newSSEServer(t,
				chunkJSON(`{"role":"assistant","content":null,"`+field+`":"Let me"}`),
				chunkJSON(`{"content":"","`+field+`":" think."}`),
				chunkJSON(`{"content":"Answer"}`),
				finishJSON("stop"),
				"[DONE]")
			ds, _, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			fid := json.RawMessage(`{"reasoning_field":"` + field + `"}`)
			want := []model.Delta{
				{Block: 0, Type: omni.TypeThinking, Text: "Let me", Fidelity: fid},
				{Block: 0, Type: omni.TypeThinking, Text: " think.", Fidelity: fid},
				{Block: 0, Type: omni.TypeThinking, End: true, Fidelity: fid},
				{Block: 1, Type: omni.TypeText, Text: "Answer"},
				{Block: 1, Type: omni.TypeText, End: true},
			}
			if !reflect.DeepEqual(ds, want) {
				t.Fatalf("deltas = %+v, want %+v", ds, want)
			}
		})
	}
}

func TestStreamParallelToolCallsAssembleInterleavedFragments(t *testing.T) {
	srv := newSSEServer(t,
		chunkJSON(`{"role":"assistant","content":"Checking."}`),
		chunkJSON(`{"tool_calls":[{"index":0,"id":"call_A","type":"function","function":{"name":"read_file","arguments":""}}]}`),
		chunkJSON(`{"tool_calls":[{"index":1,"id":"call_B","type":"function","function":{"name":"exec","arguments":"{\"cmd\":"}}]}`),
		chunkJSON(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":"}}]}`),
		chunkJSON(`{"tool_calls":[{"index":1,"function":{"arguments":"\"ls -l\"}"}},{"index":0,"function":{"arguments":"\"a.go\""}}]}`),
		chunkJSON(`{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}`),
		finishJSON("tool_calls"),
		usageJSON(100, 40, 0),
		"[DONE]")
	ds, res, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if err := checkDeltas(ds, true); err != nil {
		t.Fatal(err)
	}
	// text is block 0 and ends when the first tool call starts.
	if got := blockText(ds, 0); got != "Checking." {
		t.Errorf("text = %q", got)
	}
	if !reflect.DeepEqual(ds[1], model.Delta{Block: 0, Type: omni.TypeText, End: true}) {
		t.Errorf("second delta = %+v, want End of the text block", ds[1])
	}
	for _, c := range []struct {
		block    int
		name, id string
		args     string
	}{
		{1, "read_file", "call_A", `{"path":"a.go"}`},
		{2, "exec", "call_B", `{"cmd":"ls -l"}`},
	} {
		if got := blockText(ds, c.block); got != c.args {
			t.Errorf("block %d arguments = %q, want %q", c.block, got, c.args)
		}
		end := endOf(t, ds, c.block)
		if end.Name != c.name || end.ToolCallID != c.id || end.Type != omni.TypeToolCall {
			t.Errorf("block %d End = %+v, want name %s id %s", c.block, end, c.name, c.id)
		}
	}
	// The fragments keep their arrival order: B's first fragment precedes
	// A's second.
	var order []int
	for _, d := range ds {
		if d.Type == omni.TypeToolCall && !d.End && d.Text != "" {
			order = append(order, d.Block)
		}
	}
	if want := []int{2, 1, 2, 1, 1}; !reflect.DeepEqual(order, want) {
		t.Errorf("fragment blocks = %v, want %v", order, want)
	}
	if res.Usage.Total != 140 || res.Usage.Output != 40 {
		t.Errorf("usage = %+v", res.Usage)
	}
}

func TestStreamToolCallIDsAreSessionUnique(t *testing.T) {
	srv := newSSEServer(t,
		// no ids at all
		chunkJSON(`{"tool_calls":[{"index":0,"function":{"name":"ls","arguments":"{}"}}]}`),
		// an id that repeats the function name, twice
		chunkJSON(`{"tool_calls":[{"index":1,"id":"search","function":{"name":"search","arguments":"{\"q\":1}"}}]}`),
		chunkJSON(`{"tool_calls":[{"index":2,"id":"search","function":{"name":"search","arguments":"{\"q\":2}"}}]}`),
		// an id already used earlier in the Session
		chunkJSON(`{"tool_calls":[{"index":3,"id":"call_old","function":{"name":"ls"}}]}`),
		"[DONE]")
	ids := &model.IDAllocator{}
	ids.Observe("call_old")
	req := simpleRequest()
	req.IDs = ids
	ds, _, err := stream(t, New(Config{BaseURL: srv.URL}), req)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if err := checkDeltas(ds, true); err != nil {
		t.Fatal(err)
	}
	want := map[int]string{0: "call_1", 1: "search", 2: "call_2", 3: "call_3"}
	for block, id := range want {
		if got := endOf(t, ds, block).ToolCallID; got != id {
			t.Errorf("block %d id = %q, want %q", block, got, id)
		}
	}
	if got := blockText(ds, 3); got != "{}" {
		t.Errorf("argument-less call streamed %q, want {}", got)
	}
}

func TestStreamUsageWithCachedTokens(t *testing.T) {
	srv := newSSEServer(t, chunkJSON(`{"content":"x"}`), finishJSON("stop"), usageJSON(1000, 50, 800), "[DONE]")
	_, res, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if err != nil {
		t.Fatal(err)
	}
	want := omni.Usage{CacheRead: 800, Output: 50, Total: 1050}
	if res.Usage != want {
		t.Fatalf("usage = %+v, want %+v", res.Usage, want)
	}
}

func TestStreamContentFilterStopsFailed(t *testing.T) {
	srv := newSSEServer(t, chunkJSON(`{"content":"x"}`), finishJSON("content_filter"), "[DONE]")
	_, res, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if err != nil || res.StopReason != omni.StatusFailed {
		t.Fatalf("Stream = %+v, %v; want stop reason failed", res, err)
	}
}

func TestStreamSendsRequestShape(t *testing.T) {
	srv := newSSEServer(t, "[DONE]")
	tc := omni.ToolCall("read_file", `{"path":"a.go"}`, "call_A")
	th := omni.Thinking("I should read it.")
	th.Payload.Fidelity = json.RawMessage(`{"reasoning_field":"reasoning_content"}`)
	foreign := omni.Thinking("signed elsewhere")
	foreign.Payload.Fidelity = json.RawMessage(`{"signature":"abc"}`)
	out := omni.ToolCallOutput("call_A", "package a", "")
	out.Payload.Images = json.RawMessage(`[{"image_url":"data:image/png;base64,AAAA"}]`)
	failed := omni.ToolCallOutput("call_B", "", omni.StatusFailed)
	img := omni.Model(omni.Payload{Type: omni.TypeImageURL, Role: omni.RoleUser, ImageURL: "https://example.com/a.png"})
	req := &model.Request{
		Model:        "deepseek-chat",
		SystemPrompt: "Be brief.",
		Messages: refs(
			omni.UserText("read a.go"), img,
			foreign, th, omni.Text(omni.RoleAssistant, "Reading."), tc,
			omni.ToolCall("exec", "", "call_B"),
			out, failed,
			omni.UserText("thanks"),
		),
		Tools: []omni.ToolSpec{
			{Name: "read_file", Description: "Read a file", Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)},
			{Name: "exec", Description: "Run"},
		},
		ThinkingLevel: "high",
		IDs:           &model.IDAllocator{},
	}
	if _, _, err := stream(t, New(Config{BaseURL: srv.URL, APIKey: "sk-test", MaxTokens: 1000}), req); err != nil {
		t.Fatal(err)
	}
	want := `{
	  "model": "deepseek-chat",
	  "messages": [
	    {"role": "system", "content": "Be brief."},
	    {"role": "user", "content": [
	      {"type": "text", "text": "read a.go"},
	      {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
	    {"role": "assistant", "content": "Reading.", "reasoning_content": "I should read it.",
	     "tool_calls": [
	       {"id": "call_A", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.go\"}"}},
	       {"id": "call_B", "type": "function", "function": {"name": "exec", "arguments": "{}"}}]},
	    {"role": "tool", "content": "package a", "tool_call_id": "call_A"},
	    {"role": "tool", "content": "[no output]", "tool_call_id": "call_B"},
	    {"role": "user", "content": [
	      {"type": "text", "text": "Images returned by the tool calls above:"},
	      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
	    {"role": "user", "content": "thanks"}
	  ],
	  "tools": [
	    {"type": "function", "function": {"name": "read_file", "description": "Read a file",
	      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
	    {"type": "function", "function": {"name": "exec", "description": "Run",
	      "parameters": {"type": "object", "properties": {}}}}
	  ],
	  "reasoning_effort": "high",
	  "max_completion_tokens": 1000,
	  "stream": true,
	  "stream_options": {"include_usage": true}
	}`
	assertJSONEqual(t, srv.LastBody(), want)
	h := srv.Headers()
	if got := h.Get("Authorization"); got != "Bearer sk-test" {
		t.Errorf("Authorization = %q", got)
	}
}

func TestStreamAssistantOnlyToolCallsSendsNullContent(t *testing.T) {
	srv := newSSEServer(t, "[DONE]")
	req := simpleRequest()
	req.Messages = append(req.Messages, refs(omni.ToolCall("ls", "{}", "c1"), omni.ToolCallOutput("c1", "x", ""))...)
	if _, _, err := stream(t, New(Config{BaseURL: srv.URL}), req); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Messages []map[string]json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(srv.LastBody(), &body); err != nil {
		t.Fatal(err)
	}
	if got := string(body.Messages[1]["content"]); got != "null" {
		t.Fatalf("assistant content = %s, want null", got)
	}
	if _, ok := body.Messages[0]["reasoning_content"]; ok {
		t.Fatal("reasoning_content sent without reasoning")
	}
}

func assertJSONEqual(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("request body is not JSON: %v: %s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad expectation: %v", err)
	}
	if !reflect.DeepEqual(g, w) {
		pretty, _ := json.MarshalIndent(g, "", "  ")
		t.Fatalf("request body =\n%s\nwant\n%s", pretty, want)
	}
}

func TestStreamAbortReturnsContextError(t *testing.T) {
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: " + chunkJSON(`{"content":"partial"}`) + "\n\n"))
		w.(http.Flusher).Flush()
		stall(r)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := recorder{OnDelta: func(model.Delta) error { cancel(); return nil }}
	_, err := New(Config{BaseURL: srv.URL}).Stream(ctx, simpleRequest(), rec.Emit)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Stream after cancel = %v, want context.Canceled", err)
	}
	if got := model.StatusOf(err); got != omni.StatusAborted {
		t.Fatalf("StatusOf = %s, want aborted", got)
	}
	if ds := rec.All(); len(ds) != 1 || ds[0].End {
		t.Fatalf("deltas = %+v, want the one text delta and no End", ds)
	}
}

func TestStreamReturnsEmitError(t *testing.T) {
	srv := newSSEServer(t, chunkJSON(`{"content":"a"}`), chunkJSON(`{"content":"b"}`), "[DONE]")
	stop := errors.New("engine full")
	rec := recorder{OnDelta: func(model.Delta) error { return stop }}
	_, err := New(Config{BaseURL: srv.URL}).Stream(context.Background(), simpleRequest(), rec.Emit)
	if err != stop {
		t.Fatalf("Stream = %v, want the emit error itself", err)
	}
	if n := len(rec.All()); n != 1 {
		t.Fatalf("emitted %d deltas after emit failed, want 1", n)
	}
}

func TestInfoKnowsContextWindows(t *testing.T) {
	p := New(Config{})
	for _, c := range []struct {
		model string
		want  int64
	}{
		{"gpt-4o-mini", 128000},
		{"gpt-4.1-2025-04-14", 1047576},
		{"openai/gpt-5", 400000},
		{"deepseek-chat", 128000},
		{"llama3.2:3b", DefaultContextWindow},
	} {
		info := p.Info(c.model)
		if info.Provider != "openai" || info.ModelID != c.model || info.ContextWindow != c.want {
			t.Errorf("Info(%q) = %+v, want window %d", c.model, info, c.want)
		}
	}
}
