package openai

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/wirecache"
)

// Wire types of the request body.

type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	Tools               []chatTool     `json:"tools,omitempty"`
	ReasoningEffort     string         `json:"reasoning_effort,omitempty"`
	MaxCompletionTokens int            `json:"max_completion_tokens,omitempty"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatMessage is one message. Content is a string, a []contentPart, or nil
// (JSON null: an assistant message that only calls tools).
type chatMessage struct {
	Role             string         `json:"role"`
	Content          any            `json:"content"`
	ReasoningContent *string        `json:"reasoning_content,omitempty"`
	Reasoning        *string        `json:"reasoning,omitempty"`
	ToolCalls        []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string         `json:"tool_call_id,omitempty"`
}

type contentPart struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL string `json:"url"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatTool struct {
	Type     string      `json:"type"`
	Function toolFuncDef `json:"function"`
}

type toolFuncDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// Reasoning fields of a delta and of a replayed assistant message.
const (
	fieldReasoningContent = "reasoning_content"
	fieldReasoning        = "reasoning"
)

type fidelity struct {
	ReasoningField string `json:"reasoning_field"`
}

var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// buildRequest renders req as a streaming Chat Completions body.
//
// History: user text → role user; image_url / inline image data → image_url
// parts, joined to the user message before them; consecutive assistant
// messages (thinking, text, tool calls) → one assistant message, its text
// joined, tool calls in tool_calls and thinking replayed in the field its
// fidelity names (thinking without that fidelity came from another provider
// and is dropped); tool outputs → role tool with tool_call_id, their images
// in one user message after the run of tool messages (tool messages cannot
// carry images).
//
// With a cache, the wire messages of the Session's last request before its
// last user text are copied when this request begins with the same
// messages and a user text follows them, and only the rest is converted
// and marshalled; the bytes are the same either way (wirecache).
func buildRequest(req *model.Request, maxTokens int, cache *wirecache.Cache) ([]byte, error) {
	head := requestHead{Model: req.Model}
	tail := requestTail{Stream: true, StreamOptions: &streamOptions{IncludeUsage: true}, MaxCompletionTokens: maxTokens}
	switch req.ThinkingLevel {
	case "low", "medium", "high":
		tail.ReasoningEffort = req.ThinkingLevel
	}
	for _, t := range req.Tools {
		params := t.Parameters
		if len(params) == 0 || string(params) == "null" {
			params = emptySchema
		}
		tail.Tools = append(tail.Tools, chatTool{Type: "function", Function: toolFuncDef{Name: t.Name, Description: t.Description, Parameters: params}})
	}
	if req.Purpose != "" {
		cache = nil // a one-off request: not the Session's context
	}
	msgs := req.Messages
	pre := cache.Lookup(req.SessionID, msgs)
	if pre == nil || len(pre.Msgs) >= len(msgs) || !isCut(msgs[len(pre.Msgs)]) {
		pre = &wirecache.Prefix{}
	}
	// cut is the last user text after the prefix's first message (-1:
	// none), closed how many wire messages come before it.
	b := builder{}
	cut, closed := -1, 0
	for i := len(pre.Msgs); i < len(msgs); i++ {
		if i > len(pre.Msgs) && isCut(msgs[i]) {
			b.flush() // what adding a user text does first
			cut, closed = i, len(b.msgs)
		}
		b.add(&msgs[i].Payload)
	}
	b.flush()

	h, err := json.Marshal(&head)
	if err != nil {
		return nil, fmt.Errorf("openai: encode request: %w", err)
	}
	t, err := json.Marshal(&tail)
	if err != nil {
		return nil, fmt.Errorf("openai: encode request: %w", err)
	}
	// The body is json.Marshal's of the chatRequest: head's fields, the
	// messages (the system prompt's, the prefix's, the rest), tail's.
	body := make([]byte, 0, len(h)+len(req.SystemPrompt)+len(pre.Wire)+len(t)+256*len(b.msgs)+64)
	body = append(body, h[:len(h)-1]...)
	body = append(body, `,"messages":[`...)
	a0 := len(body)
	add := func(v []byte) {
		if len(body) > a0 {
			body = append(body, ',')
		}
		body = append(body, v...)
	}
	if req.SystemPrompt != "" {
		v, err := json.Marshal(&chatMessage{Role: "system", Content: req.SystemPrompt})
		if err != nil {
			return nil, fmt.Errorf("openai: encode request: %w", err)
		}
		add(v)
	}
	w0 := -1 // where the history's wire messages begin in body
	if len(pre.Wire) > 0 {
		add(pre.Wire)
		w0 = len(body) - len(pre.Wire)
	}
	for j := range b.msgs {
		if j == closed && cut > 0 && cache != nil {
			// The body is never written below its length: the next
			// request's prefix shares it.
			var wire []byte
			if w0 >= 0 {
				wire = body[w0:len(body):len(body)]
			}
			cache.Store(req.SessionID, &wirecache.Prefix{Msgs: slices.Clone(msgs[:cut]), Wire: wire})
		}
		v, err := json.Marshal(&b.msgs[j])
		if err != nil {
			return nil, fmt.Errorf("openai: encode request: %w", err)
		}
		add(v)
		if w0 < 0 {
			w0 = len(body) - len(v)
		}
	}
	if len(body) == a0 {
		body = append(body[:a0-1], "null,"...) // json.Marshal's nil slice
	} else {
		body = append(body, "],"...)
	}
	return append(body, t[1:]...), nil
}

// isCut reports whether m is a user text: its wire message never merges
// with what comes before it, so the wire messages before it are complete.
func isCut(m *omni.Message) bool {
	return m.Payload.Role != omni.RoleAssistant && m.Payload.Type == omni.TypeText
}

// requestHead and requestTail are the fields of a request body before and
// after its messages, in chatRequest's order.
type requestHead struct {
	Model string `json:"model"`
}

type requestTail struct {
	Tools               []chatTool     `json:"tools,omitempty"`
	ReasoningEffort     string         `json:"reasoning_effort,omitempty"`
	MaxCompletionTokens int            `json:"max_completion_tokens,omitempty"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options,omitempty"`
}

type builder struct {
	msgs []chatMessage

	// the assistant message being assembled
	inAssistant bool
	text        []string
	reasoning   map[string]*strings.Builder
	calls       []chatToolCall

	// images of the current run of tool messages
	toolImages []contentPart
}

func (b *builder) add(p *omni.Payload) {
	if p.Role == omni.RoleAssistant {
		b.flushToolImages()
		b.inAssistant = true
		switch p.Type {
		case omni.TypeText:
			if p.Text != "" {
				b.text = append(b.text, p.Text)
			}
		case omni.TypeThinking:
			var f fidelity
			if len(p.Fidelity) > 0 && json.Unmarshal(p.Fidelity, &f) == nil &&
				(f.ReasoningField == fieldReasoningContent || f.ReasoningField == fieldReasoning) {
				if b.reasoning == nil {
					b.reasoning = map[string]*strings.Builder{}
				}
				sb := b.reasoning[f.ReasoningField]
				if sb == nil {
					sb = &strings.Builder{}
					b.reasoning[f.ReasoningField] = sb
				}
				sb.WriteString(p.Thinking)
			}
		case omni.TypeToolCall:
			args := p.Arguments
			if strings.TrimSpace(args) == "" {
				args = "{}"
			}
			b.calls = append(b.calls, chatToolCall{ID: p.ToolCallID, Type: "function", Function: chatFunction{Name: p.Name, Arguments: args}})
		}
		return
	}
	b.flushAssistant()
	switch p.Type {
	case omni.TypeToolCallOutput:
		out := p.Output
		if out == "" {
			out = omni.NoOutput
		}
		b.msgs = append(b.msgs, chatMessage{Role: "tool", Content: out, ToolCallID: p.ToolCallID})
		for _, u := range p.ImageURLs() {
			b.toolImages = append(b.toolImages, contentPart{Type: "image_url", ImageURL: &imageURL{URL: u}})
		}
	case omni.TypeText:
		b.flushToolImages()
		b.msgs = append(b.msgs, chatMessage{Role: "user", Content: p.Text})
	case omni.TypeImageURL:
		b.flushToolImages()
		b.addUserImage(p.ImageURL)
	case omni.TypeInlineData:
		b.flushToolImages()
		if strings.HasPrefix(p.MimeType, "image/") {
			b.addUserImage("data:" + p.MimeType + ";base64," + p.Data)
		} else {
			b.msgs = append(b.msgs, chatMessage{Role: "user", Content: "[attachment of type " + p.MimeType + " omitted: not supported by this provider]"})
		}
	}
}

// addUserImage appends an image part to the preceding user message, or
// starts a user message.
func (b *builder) addUserImage(url string) {
	part := contentPart{Type: "image_url", ImageURL: &imageURL{URL: url}}
	if n := len(b.msgs); n > 0 && b.msgs[n-1].Role == "user" {
		last := &b.msgs[n-1]
		switch c := last.Content.(type) {
		case string:
			last.Content = []contentPart{{Type: "text", Text: c}, part}
			return
		case []contentPart:
			last.Content = append(c, part)
			return
		}
	}
	b.msgs = append(b.msgs, chatMessage{Role: "user", Content: []contentPart{part}})
}

func (b *builder) flushToolImages() {
	if len(b.toolImages) == 0 {
		return
	}
	parts := append([]contentPart{{Type: "text", Text: "Images returned by the tool calls above:"}}, b.toolImages...)
	b.msgs = append(b.msgs, chatMessage{Role: "user", Content: parts})
	b.toolImages = nil
}

func (b *builder) flushAssistant() {
	if !b.inAssistant {
		return
	}
	m := chatMessage{Role: "assistant", ToolCalls: b.calls}
	switch {
	case len(b.text) > 0:
		m.Content = strings.Join(b.text, "\n\n")
	case len(b.calls) == 0:
		m.Content = ""
	}
	if sb := b.reasoning[fieldReasoningContent]; sb != nil {
		s := sb.String()
		m.ReasoningContent = &s
	}
	if sb := b.reasoning[fieldReasoning]; sb != nil {
		s := sb.String()
		m.Reasoning = &s
	}
	if m.Content != nil || m.ToolCalls != nil || m.ReasoningContent != nil || m.Reasoning != nil {
		b.msgs = append(b.msgs, m)
	}
	b.inAssistant, b.text, b.reasoning, b.calls = false, nil, nil, nil
}

func (b *builder) flush() {
	b.flushAssistant()
	b.flushToolImages()
}
