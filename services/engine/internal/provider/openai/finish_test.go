package openai

import (
	"net/http"
	"testing"

	"floe.dev/pkg/omni"
)

// finish_reason "tool_calls" ends the calls at once: a connection lost after
// it (before the usage chunk and [DONE]) still fails the request, but the
// calls are complete, so the engine runs them and tells the retry so.
func TestStreamToolCallsEndAtFinishReasonBeforeFailure(t *testing.T) {
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range []string{
			chunkJSON(`{"tool_calls":[{"index":0,"id":"call_A","type":"function","function":{"name":"read_file","arguments":"{\"path\":"}}]}`),
			chunkJSON(`{"tool_calls":[{"index":1,"id":"call_B","type":"function","function":{"name":"exec","arguments":""}}]}`),
			chunkJSON(`{"tool_calls":[{"index":0,"function":{"arguments":"\"a.go\"}"}}]}`),
			finishJSON("tool_calls"),
		} {
			w.Write([]byte("data: " + c + "\n\n"))
			w.(http.Flusher).Flush()
		}
		hijackClose(w)
	})
	ds, _, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if me := asModelError(t, err); me.Status != omni.StatusTimeout {
		t.Fatalf("error = %+v, want timeout (connection lost)", me)
	}
	if err := checkDeltas(ds, true); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		block    int
		id, args string
	}{{0, "call_A", `{"path":"a.go"}`}, {1, "call_B", "{}"}} {
		if got := blockText(ds, c.block); got != c.args {
			t.Errorf("block %d arguments = %q, want %q", c.block, got, c.args)
		}
		if end := endOf(t, ds, c.block); end.ToolCallID != c.id {
			t.Errorf("block %d End = %+v", c.block, end)
		}
	}
}

// Arguments after finish_reason "tool_calls" cannot belong to a complete
// call: the stream is malformed, and nothing follows the call's End.
func TestStreamToolCallFragmentAfterFinishIsMalformed(t *testing.T) {
	srv := newSSEServer(t,
		chunkJSON(`{"tool_calls":[{"index":0,"id":"call_A","type":"function","function":{"name":"exec","arguments":"{\"cmd\":"}}]}`),
		finishJSON("tool_calls"),
		chunkJSON(`{"tool_calls":[{"index":0,"function":{"arguments":""}}]}`), // empty: ignored
		chunkJSON(`{"tool_calls":[{"index":0,"function":{"arguments":"\"ls\"}"}}]}`),
		"[DONE]")
	ds, _, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if me := asModelError(t, err); me.Status != omni.StatusMalformed {
		t.Fatalf("error = %+v, want malformed", me)
	}
	if err := checkDeltas(ds, true); err != nil {
		t.Fatal(err)
	}
	if got := blockText(ds, 0); got != `{"cmd":` {
		t.Errorf("arguments = %q", got)
	}
}

// Other finish reasons do not end blocks early: text cut off before [DONE]
// stays open (the engine stamps it with the failure).
func TestStreamTextDoesNotEndAtFinishStop(t *testing.T) {
	srv := newSSEServer(t, chunkJSON(`{"content":"Hello"}`), finishJSON("stop"))
	ds, _, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	if me := asModelError(t, err); me.Status != omni.StatusMalformed {
		t.Fatalf("error = %+v, want malformed", me)
	}
	for _, d := range ds {
		if d.End {
			t.Fatalf("End delta %+v on a stream cut before [DONE]", d)
		}
	}
}
