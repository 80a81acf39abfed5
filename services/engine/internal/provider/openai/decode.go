package openai

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/sse"
)

// Wire types of a streamed chunk. Fields that are null or absent decode to
// their zero value.

type chunk struct {
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage"`
	// Error is a mid-stream failure: {"error": {...}} (OpenAI, OpenRouter,
	// SGLang) or, with Object "error", a top-level message (vLLM).
	Error   json.RawMessage `json:"error"`
	Object  string          `json:"object"`
	Message string          `json:"message"`
	Code    json.RawMessage `json:"code"`
}

type choice struct {
	Index        int    `json:"index"`
	Delta        delta  `json:"delta"`
	FinishReason string `json:"finish_reason"`
}

type delta struct {
	Content          string          `json:"content"`
	Refusal          string          `json:"refusal"`
	ReasoningContent string          `json:"reasoning_content"`
	Reasoning        string          `json:"reasoning"`
	ToolCalls        []toolCallDelta `json:"tool_calls"`
}

type toolCallDelta struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type usage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	TotalTokens         int64 `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens     int64 `json:"cached_tokens"`
		CacheWriteTokens int64 `json:"cache_write_tokens"` // OpenRouter
	} `json:"prompt_tokens_details"`
	PromptCacheHitTokens int64 `json:"prompt_cache_hit_tokens"` // DeepSeek
}

var (
	doneMarker        = []byte("[DONE]")
	fidelityContent   = json.RawMessage(`{"reasoning_field":"reasoning_content"}`)
	fidelityReasoning = json.RawMessage(`{"reasoning_field":"reasoning"}`)
	emptyArguments    = "{}"
	errStop           = sse.ErrEnd
)

// finishToolCalls is the finish_reason of a turn that ends in tool calls:
// every call's arguments are complete.
const finishToolCalls = "tool_calls"

// decode reads an SSE body to its terminal [DONE] and emits deltas. Read
// errors from body are returned as they are (sse.Body has mapped them).
func decode(body io.Reader, ids *model.IDAllocator, emit func(model.Delta) error) (model.Result, error) {
	d := newDecoder(ids, emit)
	if err := sse.Decode(body, "[DONE]", d.event); err != nil {
		return model.Result{}, err
	}
	return d.result(), nil
}

// decoder turns chunks into deltas. Block numbers are handed out in order of
// appearance; at most one text and one thinking block are open at a time,
// tool-call blocks stay open until [DONE] because their fragments may
// interleave.
type decoder struct {
	ids  *model.IDAllocator
	emit func(model.Delta) error

	next     int
	blocks   []*block // every block, in block order
	text     *block   // the open text block, if any
	thinking *block   // the open thinking block, if any
	byIndex  map[int]*block
	byID     map[string]*block
	lastTool *block

	usage  omni.Usage
	finish string
}

type block struct {
	n     int
	typ   string
	name  string
	id    string // the Session-unique id
	args  int    // argument bytes emitted
	fid   json.RawMessage
	ended bool
}

func newDecoder(ids *model.IDAllocator, emit func(model.Delta) error) *decoder {
	if ids == nil {
		ids = &model.IDAllocator{}
	}
	return &decoder{ids: ids, emit: emit, byIndex: map[int]*block{}, byID: map[string]*block{}}
}

// event handles one SSE data payload. It returns errStop after [DONE].
func (d *decoder) event(data []byte) error {
	if bytes.Equal(bytes.TrimSpace(data), doneMarker) {
		return d.done()
	}
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil {
		return sse.Malformed("unparseable chunk: %v: %s", err, data)
	}
	if e := chunkError(&c); e != nil {
		return e
	}
	if c.Usage != nil {
		d.setUsage(c.Usage)
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		if ch.Index != 0 {
			continue // n > 1 is never requested
		}
		if err := d.delta(&ch.Delta); err != nil {
			return err
		}
		if ch.FinishReason != "" {
			d.finish = ch.FinishReason
			if ch.FinishReason == finishToolCalls {
				// The calls are complete: end them now, so the engine can
				// run them even if the stream breaks before [DONE] (the
				// retry is then told they ran instead of asking again).
				if err := d.endAll(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (d *decoder) delta(dl *delta) error {
	switch {
	case dl.ReasoningContent != "":
		if err := d.reason(dl.ReasoningContent, fidelityContent); err != nil {
			return err
		}
	case dl.Reasoning != "":
		if err := d.reason(dl.Reasoning, fidelityReasoning); err != nil {
			return err
		}
	}
	for _, s := range [...]string{dl.Content, dl.Refusal} {
		if s == "" {
			continue
		}
		if err := d.end(d.thinking); err != nil {
			return err
		}
		if d.text == nil {
			d.text = d.start(omni.TypeText)
		}
		if err := d.emit(model.Delta{Block: d.text.n, Type: omni.TypeText, Text: s}); err != nil {
			return err
		}
	}
	for i := range dl.ToolCalls {
		if err := d.toolCall(&dl.ToolCalls[i], len(dl.ToolCalls)); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) reason(s string, fid json.RawMessage) error {
	if err := d.end(d.text); err != nil {
		return err
	}
	if d.thinking == nil {
		d.thinking = d.start(omni.TypeThinking)
	}
	d.thinking.fid = fid
	return d.emit(model.Delta{Block: d.thinking.n, Type: omni.TypeThinking, Text: s, Fidelity: fid})
}

// toolCall handles one fragment. Fragments are keyed by index; providers
// that omit the index are keyed by id, and an id-less, index-less fragment
// continues the latest call unless it came in a batch of several (complete
// calls sent at once).
func (d *decoder) toolCall(tc *toolCallDelta, batch int) error {
	if err := d.end(d.thinking); err != nil {
		return err
	}
	if err := d.end(d.text); err != nil {
		return err
	}
	var b *block
	switch {
	case tc.Index != nil:
		b = d.byIndex[*tc.Index]
	case tc.ID != "":
		b = d.byID[tc.ID]
	case batch == 1:
		b = d.lastTool
	}
	first := b == nil
	if !first && b.ended {
		// A fragment of a call already ended by finish_reason "tool_calls".
		if tc.Function.Arguments == "" {
			return nil
		}
		return sse.Malformed("tool call %s continued after finish_reason %q", b.id, finishToolCalls)
	}
	if first {
		b = d.start(omni.TypeToolCall)
		if tc.Index != nil {
			d.byIndex[*tc.Index] = b
		} else if tc.ID != "" {
			d.byID[tc.ID] = b
		}
		b.id = d.ids.Assign(tc.ID)
		d.lastTool = b
	}
	if b.name == "" && tc.Function.Name != "" {
		b.name = tc.Function.Name
	}
	if !first && tc.Function.Arguments == "" {
		return nil
	}
	b.args += len(tc.Function.Arguments)
	return d.emit(model.Delta{Block: b.n, Type: omni.TypeToolCall, Text: tc.Function.Arguments, Name: b.name, ToolCallID: b.id})
}

func (d *decoder) start(typ string) *block {
	b := &block{n: d.next, typ: typ}
	d.next++
	d.blocks = append(d.blocks, b)
	return b
}

// end closes b if it is open. A tool call that streamed no arguments gets
// "{}" so its complete message holds a JSON object.
func (d *decoder) end(b *block) error {
	if b == nil || b.ended {
		return nil
	}
	b.ended = true
	switch b {
	case d.text:
		d.text = nil
	case d.thinking:
		d.thinking = nil
	}
	// Thinking repeats its fidelity on End, so that it is present however
	// the engine folds "the last wins".
	last := model.Delta{Block: b.n, Type: b.typ, End: true, Fidelity: b.fid}
	if b.typ == omni.TypeToolCall {
		if b.name == "" {
			return sse.Malformed("tool call %s has no function name", b.id)
		}
		if b.args == 0 {
			if err := d.emit(model.Delta{Block: b.n, Type: b.typ, Text: emptyArguments, Name: b.name, ToolCallID: b.id}); err != nil {
				return err
			}
		}
		last.Name, last.ToolCallID = b.name, b.id
	}
	return d.emit(last)
}

// done ends every open block at [DONE].
func (d *decoder) done() error {
	if err := d.endAll(); err != nil {
		return err
	}
	return errStop
}

// endAll ends every open block, in block order.
func (d *decoder) endAll() error {
	for _, b := range d.blocks {
		if err := d.end(b); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) setUsage(u *usage) {
	cached := u.PromptCacheHitTokens
	var written int64
	if u.PromptTokensDetails != nil {
		if u.PromptTokensDetails.CachedTokens > 0 {
			cached = u.PromptTokensDetails.CachedTokens
		}
		written = u.PromptTokensDetails.CacheWriteTokens
	}
	total := u.PromptTokens + u.CompletionTokens
	if total == 0 {
		total = u.TotalTokens
	}
	d.usage = omni.Usage{CacheRead: cached, CacheWrite: written, Output: u.CompletionTokens, Total: total}
}

func (d *decoder) result() model.Result {
	stop := omni.StatusCompleted
	if d.finish == "content_filter" {
		stop = omni.StatusFailed
	}
	return model.Result{Usage: d.usage, StopReason: stop}
}

// chunkError maps a mid-stream error payload. A numeric code is read as the
// HTTP status it stands for (OpenRouter forwards upstream statuses);
// otherwise rate limits, server errors, overload and timeouts are timeout,
// invalid credentials auth, and anything else failed.
func chunkError(c *chunk) *model.Error {
	var raw []byte
	switch {
	case len(c.Error) > 0 && string(c.Error) != "null":
		raw = []byte(`{"error":` + string(c.Error) + `}`)
	case c.Object == "error":
		raw = []byte(`{"message":` + strconv.Quote(c.Message) + `}`)
	default:
		return nil
	}
	msg := sse.ErrorText(raw)
	if msg == "" {
		msg = "provider reported an error mid-stream"
	}
	var e struct {
		Code json.RawMessage `json:"code"`
		Type string          `json:"type"`
	}
	_ = json.Unmarshal(c.Error, &e)
	code := e.Code
	if len(code) == 0 {
		code = c.Code
	}
	if n, err := strconv.Atoi(string(code)); err == nil && n >= 400 && n <= 599 {
		return &model.Error{Status: sse.StatusForHTTP(n, raw), Message: msg, HTTPStatus: n}
	}
	kind := strings.ToLower(string(code) + " " + e.Type)
	status := omni.StatusFailed
	switch {
	case containsAny(kind, "rate_limit", "server_error", "overloaded", "timeout", "unavailable", "internal"):
		status = omni.StatusTimeout
	case containsAny(kind, "invalid_api_key", "authentication", "unauthorized"):
		status = omni.StatusAuth
	}
	return &model.Error{Status: status, Message: msg}
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
