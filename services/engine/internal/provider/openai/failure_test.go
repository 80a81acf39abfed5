package openai

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/providertest"
)

// TestStreamFailureMatrix checks the stop reason of every failure protocol.md §6
// names, against a real HTTP server.
func TestStreamFailureMatrix(t *testing.T) {
	reject, streamThen := providertest.Reject, providertest.StreamThen
	text := "data: " + chunkJSON(`{"content":"partial"}`) + "\n\n"
	invalidKey := `{"error":{"message":"Incorrect API key provided: sk-bad.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`

	cases := []providertest.Failure{
		{Name: "500", Handler: reject(500, `{"error":{"message":"The server had an error","type":"server_error"}}`),
			WantStatus: omni.StatusTimeout, WantHTTP: 500, WantInMsg: "server_error: The server had an error"},
		{Name: "502 html", Handler: reject(502, "<html>Bad Gateway</html>"),
			WantStatus: omni.StatusTimeout, WantHTTP: 502, WantInMsg: "Bad Gateway"},
		{Name: "401", Handler: reject(401, invalidKey), WantStatus: omni.StatusAuth, WantHTTP: 401, WantInMsg: "Incorrect API key"},
		{Name: "403 invalid credential", Handler: reject(403, invalidKey), WantStatus: omni.StatusAuth, WantHTTP: 403},
		{Name: "403 bare", Handler: reject(403, `{"error":{"code":"unsupported_country_region_territory","message":"Country, region, or territory not supported","type":"request_forbidden"}}`),
			WantStatus: omni.StatusFailed, WantHTTP: 403, WantInMsg: "Country"},
		{Name: "404", Handler: reject(404, `{"error":{"message":"The model 'nope' does not exist","type":"invalid_request_error","code":"model_not_found"}}`),
			WantStatus: omni.StatusFailed, WantHTTP: 404, WantInMsg: "does not exist"},
		{Name: "400", Handler: reject(400, `{"error":{"message":"bad tools","type":"invalid_request_error"}}`),
			WantStatus: omni.StatusFailed, WantHTTP: 400},
		{Name: "429", Handler: reject(429, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`),
			WantStatus: omni.StatusTimeout, WantHTTP: 429, WantInMsg: "Rate limit"},
		{Name: "408", Handler: reject(408, ""), WantStatus: omni.StatusTimeout, WantHTTP: 408, WantInMsg: "Request Timeout"},
		{Name: "connection refused", WantStatus: omni.StatusTimeout, WantInMsg: "refused"},
		{Name: "disconnect mid-stream", Handler: streamThen(func(w http.ResponseWriter, r *http.Request) { hijackClose(w) }, text),
			WantStatus: omni.StatusTimeout, WantText: "partial"},
		{Name: "slow first byte", Handler: func(w http.ResponseWriter, r *http.Request) { stall(r) },
			WantStatus: omni.StatusTimeout, WantInMsg: "no data from provider for 200ms"},
		{Name: "stall mid-stream", Handler: streamThen(func(w http.ResponseWriter, r *http.Request) { stall(r) }, text),
			WantStatus: omni.StatusTimeout, WantText: "partial", WantInMsg: "no data"},
		{Name: "no terminal chunk", Handler: streamThen(nil, text, "data: "+finishJSON("stop")+"\n\n"),
			WantStatus: omni.StatusMalformed, WantText: "partial", WantInMsg: "[DONE]"},
		{Name: "garbage chunk", Handler: streamThen(nil, text, "data: {\"choices\": [tru\n\n"),
			WantStatus: omni.StatusMalformed, WantText: "partial", WantInMsg: "unparseable"},
		{Name: "wrong chunk shape", Handler: streamThen(nil, "data: {\"choices\":\"x\"}\n\n"),
			WantStatus: omni.StatusMalformed},
		{Name: "json body instead of stream", Handler: streamThen(nil, `{"id":"x","choices":[]}`),
			WantStatus: omni.StatusMalformed, WantInMsg: `unexpected content: {"id":"x","choices":[]}`},
		{Name: "error chunk server_error", Handler: streamThen(nil, text, "data: {\"error\":{\"message\":\"upstream died\",\"type\":\"server_error\"}}\n\n"),
			WantStatus: omni.StatusTimeout, WantText: "partial", WantInMsg: "upstream died"},
		{Name: "error chunk numeric 429", Handler: streamThen(nil, "data: {\"error\":{\"message\":\"slow down\",\"code\":429}}\n\n"),
			WantStatus: omni.StatusTimeout, WantHTTP: 429},
		{Name: "error chunk invalid request", Handler: streamThen(nil, "data: {\"error\":{\"message\":\"context too long\",\"type\":\"invalid_request_error\"}}\n\n"),
			WantStatus: omni.StatusFailed, WantInMsg: "context too long"},
		{Name: "vllm error object", Handler: streamThen(nil, "data: {\"object\":\"error\",\"message\":\"engine dead\",\"type\":\"InternalServerError\",\"code\":500}\n\n"),
			WantStatus: omni.StatusTimeout, WantHTTP: 500, WantInMsg: "engine dead"},
	}
	providertest.Failures(t, cases, "/v1", func(t *testing.T, base string, idle time.Duration) ([]model.Delta, error) {
		ds, _, err := stream(t, New(Config{BaseURL: base, IdleTimeout: idle}), simpleRequest())
		return ds, err
	})
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
