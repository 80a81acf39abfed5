package anthropic

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

	cases := []providertest.Failure{
		{Name: "500", Handler: reject(500, apiErr("api_error", "Internal server error")),
			WantStatus: omni.StatusTimeout, WantHTTP: 500, WantInMsg: "api_error: Internal server error"},
		{Name: "529 overloaded", Handler: reject(529, apiErr("overloaded_error", "Overloaded")),
			WantStatus: omni.StatusTimeout, WantHTTP: 529, WantInMsg: "Overloaded"},
		{Name: "401", Handler: reject(401, apiErr("authentication_error", "invalid x-api-key")),
			WantStatus: omni.StatusAuth, WantHTTP: 401, WantInMsg: "invalid x-api-key"},
		{Name: "403 invalid credential", Handler: reject(403, apiErr("authentication_error", "API key expired")),
			WantStatus: omni.StatusAuth, WantHTTP: 403},
		{Name: "403 bare", Handler: reject(403, apiErr("permission_error", "Your API key does not have permission to use the specified resource.")),
			WantStatus: omni.StatusFailed, WantHTTP: 403, WantInMsg: "permission_error"},
		{Name: "404", Handler: reject(404, apiErr("not_found_error", "model: claude-nope")),
			WantStatus: omni.StatusFailed, WantHTTP: 404, WantInMsg: "claude-nope"},
		{Name: "400", Handler: reject(400, apiErr("invalid_request_error", "messages: roles must alternate")),
			WantStatus: omni.StatusFailed, WantHTTP: 400, WantInMsg: "alternate"},
		{Name: "429", Handler: reject(429, apiErr("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit")),
			WantStatus: omni.StatusTimeout, WantHTTP: 429, WantInMsg: "rate limit"},
		{Name: "408", Handler: reject(408, ""), WantStatus: omni.StatusTimeout, WantHTTP: 408},
		{Name: "connection refused", WantStatus: omni.StatusTimeout, WantInMsg: "refused"},
		{Name: "disconnect mid-stream", Handler: streamThen(func(w http.ResponseWriter, r *http.Request) { hijackClose(w) }, text),
			WantStatus: omni.StatusTimeout, WantText: "partial"},
		{Name: "slow first byte", Handler: func(w http.ResponseWriter, r *http.Request) { stall(r) },
			WantStatus: omni.StatusTimeout, WantInMsg: "no data from provider for 200ms"},
		{Name: "stall mid-stream", Handler: streamThen(func(w http.ResponseWriter, r *http.Request) { stall(r) }, text),
			WantStatus: omni.StatusTimeout, WantText: "partial", WantInMsg: "no data"},
		{Name: "no terminal event", Handler: streamThen(nil, text, ev(msgDelta("end_turn", 3))),
			WantStatus: omni.StatusMalformed, WantText: "partial", WantInMsg: "message_stop"},
		{Name: "garbage event", Handler: streamThen(nil, text, "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"x}}\n\n"),
			WantStatus: omni.StatusMalformed, WantText: "partial", WantInMsg: "unparseable"},
		{Name: "delta for unknown block", Handler: streamThen(nil, ev(msgStart), ev(textDelta(3, "x"))),
			WantStatus: omni.StatusMalformed},
		{Name: "overloaded_error event", Handler: streamThen(nil, text, ev(apiErr("overloaded_error", "Overloaded"))),
			WantStatus: omni.StatusTimeout, WantText: "partial", WantInMsg: "overloaded_error: Overloaded"},
		{Name: "api_error event", Handler: streamThen(nil, text, ev(apiErr("api_error", "Internal server error"))),
			WantStatus: omni.StatusTimeout, WantText: "partial"},
		{Name: "invalid_request_error event", Handler: streamThen(nil, ev(apiErr("invalid_request_error", "prompt is too long"))),
			WantStatus: omni.StatusFailed, WantInMsg: "prompt is too long"},
		{Name: "unknown error event", Handler: streamThen(nil, ev(apiErr("brand_new_error", "?"))),
			WantStatus: omni.StatusFailed},
	}
	providertest.Failures(t, cases, "", func(t *testing.T, base string, idle time.Duration) ([]model.Delta, error) {
		ds, _, err := stream(t, New(Config{BaseURL: base, IdleTimeout: idle}), simpleRequest())
		return ds, err
	})
}
