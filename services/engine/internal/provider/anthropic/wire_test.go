package anthropic

import (
	"encoding/json"
	"testing"

	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/providertest"
)

// marshalWhole is the request body as json.Marshal gives it of the whole
// messagesRequest: what buildRequest returns, with or without a cache.
func marshalWhole(t testing.TB, req *model.Request, maxTokens int) []byte {
	t.Helper()
	mr := messagesRequest{Model: req.Model, MaxTokens: maxTokens, Stream: true}
	if req.SystemPrompt != "" {
		mr.System = []*textBlock{{Type: "text", Text: req.SystemPrompt, CacheControl: ephemeral}}
	}
	if budget, ok := thinkingBudgets[req.ThinkingLevel]; ok {
		mr.Thinking = &thinking{Type: "enabled", BudgetTokens: budget}
		mr.MaxTokens += budget
	}
	for _, tl := range req.Tools {
		schema := tl.Parameters
		if len(schema) == 0 || string(schema) == "null" {
			schema = emptySchema
		}
		mr.Tools = append(mr.Tools, tool{Name: tl.Name, Description: tl.Description, InputSchema: schema})
	}
	mr.Messages, _, _ = groups(req.Messages, nil)
	if n := len(mr.Messages); n > 0 {
		c := mr.Messages[n-1].Content
		switch b := c[len(c)-1].(type) {
		case *textBlock:
			b.CacheControl = ephemeral
		case *mediaBlock:
			b.CacheControl = ephemeral
		case *toolUseBlock:
			b.CacheControl = ephemeral
		case *toolResultBlock:
			b.CacheControl = ephemeral
		}
	}
	body, err := json.Marshal(mr)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// wire is buildRequest as providertest's wire tests drive it.
var wire = providertest.Wire{
	Build:      buildRequest,
	Whole:      marshalWhole,
	Model:      "claude",
	System:     "Be brief.",
	Thinking:   json.RawMessage(`{"signature":"s"}`),
	Foreign:    json.RawMessage(`{"reasoning_field":"reasoning"}`),
	CallID:     "toolu_%d",
	FailedID:   "call|%d",
	InlineType: "application/pdf",
	InlineData: "JVBERi0=",
}

// TestBuildRequestWithCacheEqualsWhole: providertest.CacheEqualsWhole.
func TestBuildRequestWithCacheEqualsWhole(t *testing.T) { providertest.CacheEqualsWhole(t, wire) }

func TestBuildRequestWithoutMessages(t *testing.T) { providertest.EmptyEqualsWhole(t, wire, 10) }

// BenchmarkBuildRequestLong: providertest.BuildLong.
func BenchmarkBuildRequestLong(b *testing.B) { providertest.BuildLong(b, wire) }
