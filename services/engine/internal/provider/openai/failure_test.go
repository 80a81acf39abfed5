package openai

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
	text := "data: " + chunkJSON(`{"content":"partial"}`) + "\n\n"
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
	invalidKey := `{"error":{"message":"Incorrect API key provided: sk-bad.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`

	cases := []struct {
		name       string
		handler    http.HandlerFunc // nil: connection refused
		wantStatus string
		wantHTTP   int
		wantInMsg  string
		wantText   string // streamed before the failure
	}{
		{name: "500", handler: reject(500, `{"error":{"message":"The server had an error","type":"server_error"}}`),
			wantStatus: omni.StatusTimeout, wantHTTP: 500, wantInMsg: "server_error: The server had an error"},
		{name: "502 html", handler: reject(502, "<html>Bad Gateway</html>"),
			wantStatus: omni.StatusTimeout, wantHTTP: 502, wantInMsg: "Bad Gateway"},
		{name: "401", handler: reject(401, invalidKey), wantStatus: omni.StatusAuth, wantHTTP: 401, wantInMsg: "Incorrect API key"},
		{name: "403 invalid credential", handler: reject(403, invalidKey), wantStatus: omni.StatusAuth, wantHTTP: 403},
		{name: "403 bare", handler: reject(403, `{"error":{"code":"unsupported_country_region_territory","message":"Country, region, or territory not supported","type":"request_forbidden"}}`),
			wantStatus: omni.StatusFailed, wantHTTP: 403, wantInMsg: "Country"},
		{name: "404", handler: reject(404, `{"error":{"message":"The model 'nope' does not exist","type":"invalid_request_error","code":"model_not_found"}}`),
			wantStatus: omni.StatusFailed, wantHTTP: 404, wantInMsg: "does not exist"},
		{name: "400", handler: reject(400, `{"error":{"message":"bad tools","type":"invalid_request_error"}}`),
			wantStatus: omni.StatusFailed, wantHTTP: 400},
		{name: "429", handler: reject(429, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`),
			wantStatus: omni.StatusTimeout, wantHTTP: 429, wantInMsg: "Rate limit"},
		{name: "408", handler: reject(408, ""), wantStatus: omni.StatusTimeout, wantHTTP: 408, wantInMsg: "Request Timeout"},
		{name: "connection refused", wantStatus: omni.StatusTimeout, wantInMsg: "refused"},
		{name: "disconnect mid-stream", handler: streamThen(func(w http.ResponseWriter, r *http.Request) { hijackClose(w) }, text),
			wantStatus: omni.StatusTimeout, wantText: "partial"},
		{name: "slow first byte", handler: func(w http.ResponseWriter, r *http.Request) { stall(r) },
			wantStatus: omni.StatusTimeout, wantInMsg: "no data from provider for 200ms"},
		{name: "stall mid-stream", handler: streamThen(func(w http.ResponseWriter, r *http.Request) { stall(r) }, text),
			wantStatus: omni.StatusTimeout, wantText: "partial", wantInMsg: "no data"},
		{name: "no terminal chunk", handler: streamThen(nil, text, "data: "+finishJSON("stop")+"\n\n"),
			wantStatus: omni.StatusMalformed, wantText: "partial", wantInMsg: "[DONE]"},
		{name: "garbage chunk", handler: streamThen(nil, text, "data: {\"choices\": [tru\n\n"),
			wantStatus: omni.StatusMalformed, wantText: "partial", wantInMsg: "unparseable"},
		{name: "wrong chunk shape", handler: streamThen(nil, "data: {\"choices\":\"x\"}\n\n"),
			wantStatus: omni.StatusMalformed},
		{name: "json body instead of stream", handler: streamThen(nil, `{"id":"x","choices":[]}`),
			wantStatus: omni.StatusMalformed, wantInMsg: `unexpected content: {"id":"x","choices":[]}`},
		{name: "error chunk server_error", handler: streamThen(nil, text, "data: {\"error\":{\"message\":\"upstream died\",\"type\":\"server_error\"}}\n\n"),
			wantStatus: omni.StatusTimeout, wantText: "partial", wantInMsg: "upstream died"},
		{name: "error chunk numeric 429", handler: streamThen(nil, "data: {\"error\":{\"message\":\"slow down\",\"code\":429}}\n\n"),
			wantStatus: omni.StatusTimeout, wantHTTP: 429},
		{name: "error chunk invalid request", handler: streamThen(nil, "data: {\"error\":{\"message\":\"context too long\",\"type\":\"invalid_request_error\"}}\n\n"),
			wantStatus: omni.StatusFailed, wantInMsg: "context too long"},
		{name: "vllm error object", handler: streamThen(nil, "data: {\"object\":\"error\",\"message\":\"engine dead\",\"type\":\"InternalServerError\",\"code\":500}\n\n"),
			wantStatus: omni.StatusTimeout, wantHTTP: 500, wantInMsg: "engine dead"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			base := "http://" + closedPort(t) + "/v1"
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
			if len(me.Message) > 510 {
				t.Errorf("message is %d bytes long", len(me.Message))
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

func TestStreamErrorMessageIsTruncated(t *testing.T) {
	long := strings.Repeat("x", 5000)
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
		fmt.Fprintf(w, `{"error":{"message":%q}}`, long)
	})
	_, _, err := stream(t, New(Config{BaseURL: srv.URL}), simpleRequest())
	me := asModelError(t, err)
	if len(me.Message) > 510 || !strings.HasPrefix(me.Message, "xxxx") {
		t.Fatalf("message of %d bytes: %.40q", len(me.Message), me.Message)
	}
}
