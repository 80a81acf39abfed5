package anthropic

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

const (
	msgStart   = `{"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}`
	ping       = `{"type":"ping"}`
	msgStop    = `{"type":"message_stop"}`
	textStart0 = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
)

func textDelta(i int, s string) string {
	b, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": s}})
	return string(b)
}

func deltaOf(i int, typ, field, s string) string {
	b, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": typ, field: s}})
	return string(b)
}

func blockStop(i int) string {
	b, _ := json.Marshal(map[string]any{"type": "content_block_stop", "index": i})
	return string(b)
}

func msgDelta(stop string, output int) string {
	b, _ := json.Marshal(map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": output}})
	return string(b)
}

func TestStreamTextEmitsDeltasAndEndsAtBlockStop(t *testing.T) {
	srv := newSSEServer(t, msgStart, textStart0, ping, textDelta(0, "Hello"), textDelta(0, "!"), blockStop(0), msgDelta("end_turn", 15), msgStop)
	ds, res, err := stream(t, New(Config{BaseURL: srv.URL, APIKey: "sk-ant-test"}), simpleRequest())
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	want := []model.Delta{
		{Block: 0, Type: omni.TypeText, Text: "Hello"},
		{Block: 0, Type: omni.TypeText, Text: "!"},
		{Block: 0, Type: omni.TypeText, End: true},
	}
	if !reflect.DeepEqual(ds, want) {
		t.Fatalf("deltas = %+v, want %+v", ds, want)
	}
	wantRes := model.Result{Usage: omni.Usage{Output: 15, Total: 40}, StopReason: omni.StatusCompleted}
	if res != wantRes {
		t.Fatalf("result = %+v, want %+v", res, wantRes)
	}
}

func TestStreamFullEventSequence(t *testing.T) {
	srv := newSSEServer(t,
		msgStart,
		`{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		deltaOf(0, "thinking_delta", "thinking", "I need the"),
		deltaOf(0, "thinking_delta", "thinking", " weather."),
		deltaOf(0, "signature_delta", "signature", "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"),
		blockStop(0),
		`{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
		textDelta(1, "Checking both."),
		blockStop(1),
		ping,
		`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01A","name":"get_weather","input":{}}}`,
		deltaOf(2, "input_json_delta", "partial_json", ""),
		deltaOf(2, "input_json_delta", "partial_json", `{"location":`),
		deltaOf(2, "input_json_delta", "partial_json", ` "Paris"}`),
		blockStop(2),
		`{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_01B","name":"get_time","input":{}}}`,
		deltaOf(3, "input_json_delta", "partial_json", `{"tz": "Europe/`),
		deltaOf(3, "input_json_delta", "partial_json", `Paris"}`),
		blockStop(3),
		`{"type":"content_block_start","index":4,"content_block":{"type":"tool_use","id":"toolu_01C","name":"now","input":{}}}`,
		blockStop(4),
		msgDelta("tool_use", 89),
		msgStop)
	ds, res, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if err := checkDeltas(ds, true); err != nil {
		t.Fatal(err)
	}
	if got := blockText(ds, 0); got != "I need the weather." {
		t.Errorf("thinking = %q", got)
	}
	if end := endOf(t, ds, 0); string(end.Fidelity) != `{"signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}` {
		t.Errorf("thinking End fidelity = %s", end.Fidelity)
	}
	for _, d := range ds {
		if d.Block == 0 && !d.End && d.Fidelity != nil {
			t.Errorf("signature on a thinking delta before it was complete: %+v", d)
		}
	}
	if got := blockText(ds, 1); got != "Checking both." {
		t.Errorf("text = %q", got)
	}
	for _, c := range []struct {
		block          int
		name, id, args string
	}{
		{2, "get_weather", "toolu_01A", `{"location": "Paris"}`},
		{3, "get_time", "toolu_01B", `{"tz": "Europe/Paris"}`},
		{4, "now", "toolu_01C", `{}`},
	} {
		if got := blockText(ds, c.block); got != c.args {
			t.Errorf("block %d arguments = %q, want %q", c.block, got, c.args)
		}
		end := endOf(t, ds, c.block)
		if end.Name != c.name || end.ToolCallID != c.id {
			t.Errorf("block %d End = %+v, want %s %s", c.block, end, c.name, c.id)
		}
		// the first delta announces the call before any argument arrives
		for _, d := range ds {
			if d.Block == c.block {
				if d.Text != "" || d.Name != c.name || d.ToolCallID != c.id {
					t.Errorf("block %d first delta = %+v", c.block, d)
				}
				break
			}
		}
	}
	if res.Usage.Output != 89 || res.StopReason != omni.StatusCompleted {
		t.Errorf("result = %+v", res)
	}
}

func TestStreamRedactedAndSignatureOnlyThinking(t *testing.T) {
	srv := newSSEServer(t, msgStart,
		`{"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix/LafPsn4a"}}`,
		blockStop(0),
		`{"type":"content_block_start","index":1,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		deltaOf(1, "signature_delta", "signature", "sig-only"),
		blockStop(1),
		// an empty text block produces nothing
		`{"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}`,
		blockStop(2),
		msgDelta("end_turn", 3), msgStop)
	ds, _, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if err != nil {
		t.Fatal(err)
	}
	red := json.RawMessage(`{"redacted_data":"EmwKAhgBEgy3va3pzix/LafPsn4a"}`)
	sig := json.RawMessage(`{"signature":"sig-only"}`)
	want := []model.Delta{
		{Block: 0, Type: omni.TypeThinking, Fidelity: red},
		{Block: 0, Type: omni.TypeThinking, End: true, Fidelity: red},
		{Block: 1, Type: omni.TypeThinking, Fidelity: sig},
		{Block: 1, Type: omni.TypeThinking, End: true, Fidelity: sig},
	}
	if !reflect.DeepEqual(ds, want) {
		t.Fatalf("deltas = %+v\nwant %+v", ds, want)
	}
}

func TestStreamToolCallIDsAreSessionUnique(t *testing.T) {
	srv := newSSEServer(t, msgStart,
		`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"","name":"ls","input":{}}}`,
		blockStop(0),
		`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_seen","name":"ls","input":{"path":"."}}}`,
		blockStop(1),
		msgDelta("tool_use", 9), msgStop)
	req := simpleRequest()
	req.IDs.Observe("toolu_seen")
	ds, _, err := stream(t, New(Config{BaseURL: srv.URL}), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := endOf(t, ds, 0).ToolCallID; got != "call_1" {
		t.Errorf("id-less tool_use got id %q, want call_1", got)
	}
	if got := endOf(t, ds, 1).ToolCallID; got != "call_2" {
		t.Errorf("reused id became %q, want call_2", got)
	}
	// input given whole in content_block_start (compatible servers) is kept
	if got := blockText(ds, 1); got != `{"path":"."}` {
		t.Errorf("arguments = %q", got)
	}
}

func TestStreamUsageCountsCache(t *testing.T) {
	srv := newSSEServer(t,
		`{"type":"message_start","message":{"id":"msg_02","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","usage":{"input_tokens":10,"cache_creation_input_tokens":2000,"cache_read_input_tokens":30000,"output_tokens":1}}}`,
		textStart0, textDelta(0, "ok"), blockStop(0),
		`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":10,"cache_creation_input_tokens":2000,"cache_read_input_tokens":30000,"output_tokens":42}}`,
		msgStop)
	_, res, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if err != nil {
		t.Fatal(err)
	}
	want := omni.Usage{CacheRead: 30000, CacheWrite: 2000, Output: 42, Total: 32052}
	if res.Usage != want {
		t.Fatalf("usage = %+v, want %+v", res.Usage, want)
	}
}

func TestStreamRefusalStopsFailed(t *testing.T) {
	srv := newSSEServer(t, msgStart, textStart0, textDelta(0, "I can't"), blockStop(0), msgDelta("refusal", 3), msgStop)
	_, res, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if err != nil || res.StopReason != omni.StatusFailed {
		t.Fatalf("Stream = %+v, %v; want stop reason failed", res, err)
	}
}

func TestStreamSendsRequestShape(t *testing.T) {
	srv := newSSEServer(t, msgStart, msgStop)
	th := omni.Thinking("I should read it.")
	th.Payload.Fidelity = json.RawMessage(`{"signature":"sig1"}`)
	red := omni.Thinking("")
	red.Payload.Fidelity = json.RawMessage(`{"redacted_data":"opaque"}`)
	foreign := omni.Thinking("from deepseek")
	foreign.Payload.Fidelity = json.RawMessage(`{"reasoning_field":"reasoning_content"}`)
	out := omni.ToolCallOutput("toolu_A", "package a", "")
	out.Payload.Images = json.RawMessage(`["data:image/png;base64,AAAA"]`)
	failed := omni.ToolCallOutput("call|B", "exit status 1", omni.StatusFailed)
	img := omni.Model(omni.Payload{Type: omni.TypeImageURL, Role: omni.RoleUser, ImageURL: "https://example.com/a.png"})
	req := &model.Request{
		Model:        "claude-sonnet-4-5",
		SystemPrompt: "Be brief.",
		Messages: refs(
			omni.UserText("read a.go"), img,
			foreign, th, red, omni.Text(omni.RoleAssistant, "Reading."), omni.Text(omni.RoleAssistant, ""),
			omni.ToolCall("read_file", `{"path":"a.go"}`, "toolu_A"),
			omni.ToolCall("exec", "not json", "call|B"),
			out, failed,
			omni.UserText("thanks"),
		),
		Tools: []omni.ToolSpec{
			{Name: "read_file", Description: "Read a file", Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)},
			{Name: "exec"},
		},
		ThinkingLevel: "medium",
		IDs:           &model.IDAllocator{},
	}
	if _, _, err := stream(t, New(Config{BaseURL: srv.URL, APIKey: "sk-ant-test"}), req); err != nil {
		t.Fatal(err)
	}
	want := `{
	  "model": "claude-sonnet-4-5",
	  "max_tokens": 16384,
	  "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
	  "messages": [
	    {"role": "user", "content": [
	      {"type": "text", "text": "read a.go"},
	      {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]},
	    {"role": "assistant", "content": [
	      {"type": "thinking", "thinking": "I should read it.", "signature": "sig1"},
	      {"type": "redacted_thinking", "data": "opaque"},
	      {"type": "text", "text": "Reading."},
	      {"type": "tool_use", "id": "toolu_A", "name": "read_file", "input": {"path": "a.go"}},
	      {"type": "tool_use", "id": "call_B", "name": "exec", "input": {}}]},
	    {"role": "user", "content": [
	      {"type": "tool_result", "tool_use_id": "toolu_A", "content": [
	        {"type": "text", "text": "package a"},
	        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
	      {"type": "tool_result", "tool_use_id": "call_B", "content": "exit status 1", "is_error": true},
	      {"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}}]}
	  ],
	  "tools": [
	    {"name": "read_file", "description": "Read a file",
	     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
	    {"name": "exec", "input_schema": {"type": "object", "properties": {}}}
	  ],
	  "thinking": {"type": "enabled", "budget_tokens": 8192},
	  "stream": true
	}`
	assertJSONEqual(t, srv.LastBody(), want)
	h := srv.Headers()
	if h.Get("X-Api-Key") != "sk-ant-test" || h.Get("Anthropic-Version") != APIVersion {
		t.Errorf("headers = %v", h)
	}
}

func TestStreamMergesUserTextBeforeToolResults(t *testing.T) {
	srv := newSSEServer(t, msgStart, msgStop)
	req := simpleRequest()
	req.Messages = append(req.Messages, refs(
		omni.ToolCall("ls", "{}", "t1"),
		omni.UserText("steer: hurry"), // arrived while the tool ran
		omni.ToolCallOutput("t1", "a b", ""))...)
	if _, _, err := stream(t, New(Config{BaseURL: srv.URL}), req); err != nil {
		t.Fatal(err)
	}
	want := `{"model":"claude-sonnet-4-5","max_tokens":8192,"stream":true,"messages":[
	  {"role":"user","content":[{"type":"text","text":"hi"}]},
	  {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"ls","input":{}}]},
	  {"role":"user","content":[
	    {"type":"tool_result","tool_use_id":"t1","content":"a b"},
	    {"type":"text","text":"steer: hurry","cache_control":{"type":"ephemeral"}}]}]}`
	assertJSONEqual(t, srv.LastBody(), want)
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
		w.Write([]byte("event: message_start\ndata: " + msgStart + "\n\nevent: content_block_start\ndata: " + textStart0 + "\n\nevent: content_block_delta\ndata: " + textDelta(0, "partial") + "\n\n"))
		w.(http.Flusher).Flush()
		stall(r)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := recorder{OnDelta: func(model.Delta) error { cancel(); return nil }}
	_, err := New(Config{BaseURL: srv.URL}).Stream(ctx, simpleRequest(), rec.Emit)
	if !errors.Is(err, context.Canceled) || model.StatusOf(err) != omni.StatusAborted {
		t.Fatalf("Stream after cancel = %v, want context.Canceled", err)
	}
	if ds := rec.All(); len(ds) != 1 || ds[0].End {
		t.Fatalf("deltas = %+v, want the one text delta and no End", ds)
	}
}

func TestStreamReturnsEmitError(t *testing.T) {
	srv := newSSEServer(t, msgStart, textStart0, textDelta(0, "a"), textDelta(0, "b"), blockStop(0), msgStop)
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
		{"claude-sonnet-4-5", 200000},
		{"claude-opus-4-1-20250805", 200000},
		{"claude-2.0", 100000},
	} {
		info := p.Info(c.model)
		if info.Provider != "anthropic" || info.ModelID != c.model || info.ContextWindow != c.want {
			t.Errorf("Info(%q) = %+v, want window %d", c.model, info, c.want)
		}
	}
}
