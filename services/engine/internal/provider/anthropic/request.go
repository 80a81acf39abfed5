package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// Wire types of the request body.

type messagesRequest struct {
	Model     string       `json:"model"`
	MaxTokens int          `json:"max_tokens"`
	System    []*textBlock `json:"system,omitempty"`
	Messages  []message    `json:"messages"`
	Tools     []tool       `json:"tools,omitempty"`
	Thinking  *thinking    `json:"thinking,omitempty"`
	Stream    bool         `json:"stream"`
}

type thinking struct {
	Type         string `json:"type"`
	BudgetTokens int    `json:"budget_tokens"`
}

type message struct {
	Role    string `json:"role"`
	Content []any  `json:"content"`
}

type tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type cacheControl struct {
	Type string `json:"type"`
}

var ephemeral = &cacheControl{Type: "ephemeral"}

type textBlock struct {
	Type         string        `json:"type"`
	Text         string        `json:"text"`
	CacheControl *cacheControl `json:"cache_control,omitempty"`
}

// mediaBlock is an image or document block.
type mediaBlock struct {
	Type         string        `json:"type"`
	Source       mediaSource   `json:"source"`
	CacheControl *cacheControl `json:"cache_control,omitempty"`
}

type mediaSource struct {
	Type      string `json:"type"` // base64 | url
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

type thinkingBlock struct {
	Type      string `json:"type"`
	Thinking  string `json:"thinking"`
	Signature string `json:"signature"`
}

type redactedThinkingBlock struct {
	Type string `json:"type"`
	Data string `json:"data"`
}

type toolUseBlock struct {
	Type         string          `json:"type"`
	ID           string          `json:"id"`
	Name         string          `json:"name"`
	Input        json.RawMessage `json:"input"`
	CacheControl *cacheControl   `json:"cache_control,omitempty"`
}

type toolResultBlock struct {
	Type         string        `json:"type"`
	ToolUseID    string        `json:"tool_use_id"`
	Content      any           `json:"content"` // string or []any of text/image blocks
	IsError      bool          `json:"is_error,omitempty"`
	CacheControl *cacheControl `json:"cache_control,omitempty"`
}

// fidelity is the opaque provider data of a thinking message.
type fidelity struct {
	Signature    string `json:"signature,omitempty"`
	RedactedData string `json:"redacted_data,omitempty"`
}

// thinkingBudgets maps thinking levels to budget_tokens.
var thinkingBudgets = map[string]int{"low": 2048, "medium": 8192, "high": 16384}

var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// buildRequest renders req as a streaming Messages API body.
//
// History: user text, images and documents → user content blocks; assistant
// thinking with a signature → thinking blocks (redacted ones →
// redacted_thinking), without one (another provider's) → dropped; text →
// text blocks (empty text is dropped, the API rejects it); tool calls →
// tool_use; tool outputs → tool_result on the user side, is_error when the
// output's stop_reason is failed or aborted. Consecutive same-role messages
// are merged, tool_result blocks first in a user message as the API
// requires. Prompt caching: the system prompt and the last message's last
// block carry an ephemeral cache_control breakpoint.
func buildRequest(req *model.Request, maxTokens int) ([]byte, error) {
	mr := messagesRequest{Model: req.Model, MaxTokens: maxTokens, Stream: true}
	if req.SystemPrompt != "" {
		mr.System = []*textBlock{{Type: "text", Text: req.SystemPrompt, CacheControl: ephemeral}}
	}
	if budget, ok := thinkingBudgets[req.ThinkingLevel]; ok {
		mr.Thinking = &thinking{Type: "enabled", BudgetTokens: budget}
		mr.MaxTokens += budget
	}
	for _, t := range req.Tools {
		schema := t.Parameters
		if len(schema) == 0 || string(schema) == "null" {
			schema = emptySchema
		}
		mr.Tools = append(mr.Tools, tool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	for i := range req.Messages {
		role, blk := convert(&req.Messages[i].Payload)
		if blk == nil {
			continue
		}
		if n := len(mr.Messages); n > 0 && mr.Messages[n-1].Role == role {
			mr.Messages[n-1].Content = append(mr.Messages[n-1].Content, blk)
			continue
		}
		mr.Messages = append(mr.Messages, message{Role: role, Content: []any{blk}})
	}
	for i := range mr.Messages {
		if mr.Messages[i].Role == "user" {
			toolResultsFirst(mr.Messages[i].Content)
		}
	}
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
		return nil, fmt.Errorf("anthropic: encode request: %w", err)
	}
	return body, nil
}

// convert maps one complete model message to a role and content block; a
// nil block means the message has nothing to send.
func convert(p *omni.Payload) (string, any) {
	switch p.Type {
	case omni.TypeText:
		if p.Text == "" {
			return "", nil
		}
		role := "user"
		if p.Role == omni.RoleAssistant {
			role = "assistant"
		}
		return role, &textBlock{Type: "text", Text: p.Text}
	case omni.TypeThinking:
		var f fidelity
		if len(p.Fidelity) == 0 || json.Unmarshal(p.Fidelity, &f) != nil {
			return "", nil
		}
		switch {
		case f.Signature != "":
			return "assistant", &thinkingBlock{Type: "thinking", Thinking: p.Thinking, Signature: f.Signature}
		case f.RedactedData != "":
			return "assistant", &redactedThinkingBlock{Type: "redacted_thinking", Data: f.RedactedData}
		}
		return "", nil
	case omni.TypeToolCall:
		return "assistant", &toolUseBlock{Type: "tool_use", ID: toolID(p.ToolCallID), Name: p.Name, Input: toolInput(p.Arguments)}
	case omni.TypeToolCallOutput:
		out := p.Output
		if out == "" {
			out = omni.NoOutput
		}
		tr := &toolResultBlock{Type: "tool_result", ToolUseID: toolID(p.ToolCallID), Content: out,
			IsError: p.StopReason == omni.StatusFailed || p.StopReason == omni.StatusAborted}
		if urls := p.ImageURLs(); len(urls) > 0 {
			parts := []any{&textBlock{Type: "text", Text: out}}
			for _, u := range urls {
				parts = append(parts, imageBlock(u))
			}
			tr.Content = parts
		}
		return "user", tr
	case omni.TypeImageURL:
		if p.ImageURL == "" {
			return "", nil
		}
		return "user", imageBlock(p.ImageURL)
	case omni.TypeInlineData:
		if p.Data == "" {
			return "", nil
		}
		typ := "image"
		if !strings.HasPrefix(p.MimeType, "image/") {
			typ = "document"
		}
		return "user", &mediaBlock{Type: typ, Source: mediaSource{Type: "base64", MediaType: p.MimeType, Data: p.Data}}
	}
	return "", nil
}

// imageBlock maps a URL or a base64 data URL to an image block.
func imageBlock(u string) *mediaBlock {
	if rest, ok := strings.CutPrefix(u, "data:"); ok {
		if meta, data, ok := strings.Cut(rest, ","); ok {
			if mt, ok := strings.CutSuffix(meta, ";base64"); ok {
				return &mediaBlock{Type: "image", Source: mediaSource{Type: "base64", MediaType: mt, Data: data}}
			}
		}
	}
	return &mediaBlock{Type: "image", Source: mediaSource{Type: "url", URL: u}}
}

// toolInput returns arguments when they are a JSON object, else {} (the API
// requires an object; arguments the model garbled cannot be replayed).
func toolInput(args string) json.RawMessage {
	b := bytes.TrimSpace([]byte(args))
	if len(b) > 0 && b[0] == '{' && json.Valid(b) {
		return b
	}
	return json.RawMessage(`{}`)
}

// toolID makes an id acceptable to the API (^[a-zA-Z0-9_-]+$), mapping other
// characters to '_'; ids from other providers may contain them.
func toolID(id string) string {
	ok := id != ""
	for i := 0; i < len(id) && ok; i++ {
		ok = isIDByte(id[i])
	}
	if ok {
		return id
	}
	if id == "" {
		return "_"
	}
	b := []byte(id)
	for i := range b {
		if !isIDByte(b[i]) {
			b[i] = '_'
		}
	}
	return string(b)
}

func isIDByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// toolResultsFirst moves tool_result blocks ahead of other blocks, keeping
// the order within each group.
func toolResultsFirst(c []any) {
	out := make([]any, 0, len(c))
	for _, b := range c {
		if _, ok := b.(*toolResultBlock); ok {
			out = append(out, b)
		}
	}
	for _, b := range c {
		if _, ok := b.(*toolResultBlock); !ok {
			out = append(out, b)
		}
	}
	copy(c, out)
}
