package anthropic

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// TestStreamFailureMatrix checks the stop reason of every failure protocol.md §6
// names, against a real HTTP server.
func TestStreamFailureMatrix(t *testing.T) {
	reject := func(code int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprint(w, body)
		}
	}
	apiErr := func(typ, msg string) string {
		return fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}`, typ, msg)
	}
	ev := func(data string) string {
		var typ string
		if i := strings.Index(data, `"type":"`); i >= 0 {
			typ = data[i+8:]
			typ = typ[:strings.IndexByte(typ, '"')]
		}
		return "event: " + typ + "\ndata: " + data + "\n\n"
	}
	text := ev(msgStart) + ev(textStart0) + ev(textDelta(0, "partial"))
	streamThen := func(after func(w http.ResponseWriter, r *http.Request), events ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, e := range events {
				fmt.Fprint(w, e)
				w.(http.Flusher).Flush()
			}
			if after != nil {
				after(w, r)
			}
		}
	}

	cases := []struct {
		name       string
		handler    http.HandlerFunc // nil: connection refused
		wantStatus string
		wantHTTP   int
		wantInMsg  string
		wantText   string
	}{
		{name: "500", handler: reject(500, apiErr("api_error", "Internal server error")),
			wantStatus: omni.StatusTimeout, wantHTTP: 500, wantInMsg: "api_error: Internal server error"},
		{name: "529 overloaded", handler: reject(529, apiErr("overloaded_error", "Overloaded")),
			wantStatus: omni.StatusTimeout, wantHTTP: 529, wantInMsg: "Overloaded"},
		{name: "401", handler: reject(401, apiErr("authentication_error", "invalid x-api-key")),
			wantStatus: omni.StatusAuth, wantHTTP: 401, wantInMsg: "invalid x-api-key"},
		{name: "403 invalid credential", handler: reject(403, apiErr("authentication_error", "API key expired")),
			wantStatus: omni.StatusAuth, wantHTTP: 403},
		{name: "403 bare", handler: reject(403, apiErr("permission_error", "Your API key does not have permission to use the specified resource.")),
			wantStatus: omni.StatusFailed, wantHTTP: 403, wantInMsg: "permission_error"},
		{name: "404", handler: reject(404, apiErr("not_found_error", "model: claude-nope")),
			wantStatus: omni.StatusFailed, wantHTTP: 404, wantInMsg: "claude-nope"},
		{name: "400", handler: reject(400, apiErr("invalid_request_error", "messages: roles must alternate")),
			wantStatus: omni.StatusFailed, wantHTTP: 400, wantInMsg: "alternate"},
		{name: "429", handler: reject(429, apiErr("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit")),
			wantStatus: omni.StatusTimeout, wantHTTP: 429, wantInMsg: "rate limit"},
		{name: "408", handler: reject(408, ""), wantStatus: omni.StatusTimeout, wantHTTP: 408},
		{name: "connection refused", wantStatus: omni.StatusTimeout, wantInMsg: "refused"},
		{name: "disconnect mid-stream", handler: streamThen(func(w http.ResponseWriter, r *http.Request) { hijackClose(w) }, text),
			wantStatus: omni.StatusTimeout, wantText: "partial"},
		{name: "slow first byte", handler: func(w http.ResponseWriter, r *http.Request) { stall(r) },
			wantStatus: omni.StatusTimeout, wantInMsg: "no data from provider for 200ms"},
		{name: "stall mid-stream", handler: streamThen(func(w http.ResponseWriter, r *http.Request) { stall(r) }, text),
			wantStatus: omni.StatusTimeout, wantText: "partial", wantInMsg: "no data"},
		{name: "no terminal event", handler: streamThen(nil, text, ev(msgDelta("end_turn", 3))),
			wantStatus: omni.StatusMalformed, wantText: "partial", wantInMsg: "message_stop"},
		{name: "garbage event", handler: streamThen(nil, text, "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"x}}\n\n"),
			wantStatus: omni.StatusMalformed, wantText: "partial", wantInMsg: "unparseable"},
		{name: "delta for unknown block", handler: streamThen(nil, ev(msgStart), ev(textDelta(3, "x"))),
			wantStatus: omni.StatusMalformed},
		{name: "overloaded_error event", handler: streamThen(nil, text, ev(apiErr("overloaded_error", "Overloaded"))),
			wantStatus: omni.StatusTimeout, wantText: "partial", wantInMsg: "overloaded_error: Overloaded"},
		{name: "api_error event", handler: streamThen(nil, text, ev(apiErr("api_error", "Internal server error"))),
			wantStatus: omni.StatusTimeout, wantText: "partial"},
		{name: "invalid_request_error event", handler: streamThen(nil, ev(apiErr("invalid_request_error", "prompt is too long"))),
			wantStatus: omni.StatusFailed, wantInMsg: "prompt is too long"},
		{name: "unknown error event", handler: streamThen(nil, ev(apiErr("brand_new_error", "?"))),
			wantStatus: omni.StatusFailed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			base := "http://" + closedPort(t)
			if c.handler != nil {
				base = serve(t, c.handler).URL
			}
			// Only the cases that test the idle timeout get a short one;
			// the others must not trip it on a loaded machine.
			idle := 5 * time.Second
			if strings.Contains(c.wantInMsg, "no data") {
				idle = 200 * time.Millisecond
			}
			p := New(Config{BaseURL: base, IdleTimeout: idle})
			start := time.Now()
			ds, _, err := stream(t, p, simpleRequest())
			if err == nil {
				t.Fatalf("Stream succeeded, want %s", c.wantStatus)
			}
			me := asModelError(t, err)
			if me.Status != c.wantStatus || me.HTTPStatus != c.wantHTTP {
				t.Errorf("error = %+v, want status %s HTTP %d", me, c.wantStatus, c.wantHTTP)
			}
			if model.StatusOf(err) != c.wantStatus {
				t.Errorf("StatusOf = %s", model.StatusOf(err))
			}
			if !strings.Contains(me.Message, c.wantInMsg) {
				t.Errorf("message %q does not contain %q", me.Message, c.wantInMsg)
			}
			if got := blockText(ds, 0); got != c.wantText {
				t.Errorf("streamed %q before failing, want %q", got, c.wantText)
			}
			for _, d := range ds {
				if d.End {
					t.Errorf("End delta %+v emitted on a failed stream", d)
				}
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("failure took %s", el)
			}
		})
	}
}
