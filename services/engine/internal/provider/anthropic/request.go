package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/wirecache"
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
//
// With a cache, the wire messages of the Session's last request that
// precede its last one are copied when this request begins with the same
// messages, and only the rest is converted and marshalled; the bytes are
// the same either way (wirecache).
func buildRequest(req *model.Request, maxTokens int, cache *wirecache.Cache) ([]byte, error) {
	head := requestHead{Model: req.Model, MaxTokens: maxTokens}
	tail := requestTail{Stream: true}
	if req.SystemPrompt != "" {
		head.System = []*textBlock{{Type: "text", Text: req.SystemPrompt, CacheControl: ephemeral}}
	}
	if budget, ok := thinkingBudgets[req.ThinkingLevel]; ok {
		tail.Thinking = &thinking{Type: "enabled", BudgetTokens: budget}
		head.MaxTokens += budget
	}
	for _, t := range req.Tools {
		schema := t.Parameters
		if len(schema) == 0 || string(schema) == "null" {
			schema = emptySchema
		}
		tail.Tools = append(tail.Tools, tool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	if req.Purpose != "" {
		cache = nil // a one-off request: not the Session's context
	}
	msgs, pre, starts := groups(req.Messages, cache.Lookup(req.SessionID, req.Messages))
	if n := len(msgs); n > 0 {
		c := msgs[n-1].Content
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
	h, err := json.Marshal(&head)
	if err != nil {
		return nil, fmt.Errorf("anthropic: encode request: %w", err)
	}
	t, err := json.Marshal(&tail)
	if err != nil {
		return nil, fmt.Errorf("anthropic: encode request: %w", err)
	}
	// The body is json.Marshal's of the messagesRequest: head's fields,
	// the messages, tail's fields.
	body := make([]byte, 0, len(h)+len(pre.Wire)+len(t)+256*len(msgs))
	body = append(body, h[:len(h)-1]...)
	body = append(body, `,"messages":[`...)
	w0 := len(body)
	body = append(body, pre.Wire...)
	for i := range msgs {
		if i == len(msgs)-1 && i > 0 && cache != nil {
			// The wire messages but the last (which carries the
			// breakpoint) begin the Session's next request. The body is
			// never written below its length: they share it.
			cache.Store(req.SessionID, &wirecache.Prefix{Msgs: slices.Clone(req.Messages[:starts[i]]),
				Wire: body[w0:len(body):len(body)], Tag: msgs[i-1].Role})
		}
		b, err := json.Marshal(&msgs[i])
		if err != nil {
			return nil, fmt.Errorf("anthropic: encode request: %w", err)
		}
		if len(body) > w0 {
			body = append(body, ',')
		}
		body = append(body, b...)
	}
	if len(msgs) == 0 {
		body = append(body[:w0-1], "null,"...) // json.Marshal's nil slice
	} else {
		body = append(body, "],"...)
	}
	return append(body, t[1:]...), nil
}

// requestHead and requestTail are the fields of a request body before and
// after its messages, in messagesRequest's order.
type requestHead struct {
	Model     string       `json:"model"`
	MaxTokens int          `json:"max_tokens"`
	System    []*textBlock `json:"system,omitempty"`
}

type requestTail struct {
	Tools    []tool    `json:"tools,omitempty"`
	Thinking *thinking `json:"thinking,omitempty"`
	Stream   bool      `json:"stream"`
}

// groups converts msgs after the prefix pre (nil: none) into wire
// messages, consecutive same-role blocks merged, tool_result blocks first
// in a user message. It returns them, the prefix they follow (an empty
// one when pre is nil or the first of them would merge into its last
// message) and the index in msgs of each one's first message.
func groups(msgs []*omni.Message, pre *wirecache.Prefix) ([]message, *wirecache.Prefix, []int) {
	if pre == nil {
		pre = &wirecache.Prefix{}
	}
	var out []message
	var starts []int
	for i := len(pre.Msgs); i < len(msgs); i++ {
		role, blk := convert(&msgs[i].Payload)
		if blk == nil {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Role == role {
			out[n-1].Content = append(out[n-1].Content, blk)
			continue
		}
		if len(out) == 0 && role == pre.Tag && len(pre.Msgs) > 0 {
			// It merges into the prefix's last wire message: convert
			// everything.
			return groups(msgs, nil)
		}
		out = append(out, message{Role: role, Content: []any{blk}})
		starts = append(starts, i)
	}
	if len(out) == 0 && len(pre.Msgs) > 0 {
		// The last block is in the prefix, without its breakpoint.
		return groups(msgs, nil)
	}
	for i := range out {
		if out[i].Role == "user" {
			toolResultsFirst(out[i].Content)
		}
	}
	return out, pre, starts
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
