package openai

import (
	"encoding/json"
	"testing"

	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/providertest"
)

// marshalWhole is the request body as json.Marshal gives it of the whole
// chatRequest: what buildRequest returns, with or without a cache.
func marshalWhole(t testing.TB, req *model.Request, maxTokens int) []byte {
	t.Helper()
	b := builder{}
	if req.SystemPrompt != "" {
		b.msgs = append(b.msgs, chatMessage{Role: "system", Content: req.SystemPrompt})
	}
	for i := range req.Messages {
		b.add(&req.Messages[i].Payload)
	}
	b.flush()
	cr := chatRequest{Model: req.Model, Messages: b.msgs, Stream: true, StreamOptions: &streamOptions{IncludeUsage: true}, MaxCompletionTokens: maxTokens}
	switch req.ThinkingLevel {
	case "low", "medium", "high":
		cr.ReasoningEffort = req.ThinkingLevel
	}
	for _, tl := range req.Tools {
		params := tl.Parameters
		if len(params) == 0 || string(params) == "null" {
			params = emptySchema
		}
		cr.Tools = append(cr.Tools, chatTool{Type: "function", Function: toolFuncDef{Name: tl.Name, Description: tl.Description, Parameters: params}})
	}
	body, err := json.Marshal(cr)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// wire is buildRequest as providertest's wire tests drive it.
var wire = providertest.Wire{
	Build:          buildRequest,
	Whole:          marshalWhole,
	Model:          "gpt",
	System:         "Be brief.",
	OptionalSystem: true, // the system prompt is the body's first message
	Thinking:       json.RawMessage(`{"reasoning_field":"reasoning_content"}`),
	Foreign:        json.RawMessage(`{"signature":"s"}`),
	CallID:         "call_%d",
	FailedID:       "call_%d",
	InlineType:     "image/png",
	InlineData:     "AAAA",
}

// TestBuildRequestWithCacheEqualsWhole: providertest.CacheEqualsWhole.
func TestBuildRequestWithCacheEqualsWhole(t *testing.T) { providertest.CacheEqualsWhole(t, wire) }

func TestBuildRequestWithoutMessages(t *testing.T) { providertest.EmptyEqualsWhole(t, wire, 0) }

// BenchmarkBuildRequestLong: providertest.BuildLong.
func BenchmarkBuildRequestLong(b *testing.B) { providertest.BuildLong(b, wire) }
