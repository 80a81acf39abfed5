package anthropic

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/sse"
)

// Wire types of a stream event: one struct for every event type, since they
// share field names.

type event struct {
	Type         string        `json:"type"`
	Index        *int          `json:"index"`
	Message      *startMessage `json:"message"`
	ContentBlock *contentBlock `json:"content_block"`
	Delta        *eventDelta   `json:"delta"`
	Usage        *usage        `json:"usage"`
	Error        *apiError     `json:"error"`
}

type startMessage struct {
	Usage *usage `json:"usage"`
}

type contentBlock struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	Signature string          `json:"signature"`
	Data      string          `json:"data"`
}

type eventDelta struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Thinking    string `json:"thinking"`
	Signature   string `json:"signature"`
	PartialJSON string `json:"partial_json"`
	StopReason  string `json:"stop_reason"`
}

// usage fields are pointers: message_delta repeats only some of them, and
// the counts it carries are cumulative.
type usage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

type apiError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

var errStop = sse.ErrEnd

// decode reads an SSE body to its terminal message_stop and emits deltas.
// Read errors from body are returned as they are (sse.Body has mapped them).
func decode(body io.Reader, ids *model.IDAllocator, emit func(model.Delta) error) (model.Result, error) {
	d := newDecoder(ids, emit)
	if err := sse.Decode(body, "message_stop", d.event); err != nil {
		return model.Result{}, err
	}
	return d.result(), nil
}

// decoder turns events into deltas, keyed by content block index.
type decoder struct {
	ids  *model.IDAllocator
	emit func(model.Delta) error

	blocks map[int]*block // started blocks, open or ended
	order  []*block       // started blocks in start order

	input, output, cacheWrite, cacheRead int64
	stop                                 string
}

type block struct {
	n        int
	typ      string // omni type; "" for block types Floe ignores (server tools…)
	ended    bool
	emitted  bool // a non-End delta was emitted
	name, id string
	args     int             // argument bytes emitted
	input    json.RawMessage // tool_use input from content_block_start
	sig      strings.Builder
	redacted string
}

func newDecoder(ids *model.IDAllocator, emit func(model.Delta) error) *decoder {
	if ids == nil {
		ids = &model.IDAllocator{}
	}
	return &decoder{ids: ids, emit: emit, blocks: map[int]*block{}}
}

// event handles one SSE data payload. It returns errStop after message_stop.
// Unknown event and block types are ignored, as the API's versioning policy
// asks; a delta or stop for a block that was never started is malformed.
func (d *decoder) event(data []byte) error {
	var ev event
	if err := json.Unmarshal(data, &ev); err != nil {
		return sse.Malformed("unparseable event: %v: %s", err, data)
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil && ev.Message.Usage != nil {
			d.setUsage(ev.Message.Usage)
		}
	case "content_block_start":
		if ev.Index == nil || ev.ContentBlock == nil {
			return sse.Malformed("content_block_start without index or content_block: %s", data)
		}
		return d.start(*ev.Index, ev.ContentBlock)
	case "content_block_delta":
		if ev.Index == nil || ev.Delta == nil {
			return sse.Malformed("content_block_delta without index or delta: %s", data)
		}
		return d.delta(*ev.Index, ev.Delta)
	case "content_block_stop":
		if ev.Index == nil {
			return sse.Malformed("content_block_stop without index: %s", data)
		}
		b := d.blocks[*ev.Index]
		if b == nil || b.ended {
			return sse.Malformed("content_block_stop for block %d that is not open", *ev.Index)
		}
		return d.end(b)
	case "message_delta":
		if ev.Delta != nil && ev.Delta.StopReason != "" {
			d.stop = ev.Delta.StopReason
		}
		if ev.Usage != nil {
			d.setUsage(ev.Usage)
		}
	case "message_stop":
		for _, b := range d.order {
			if b.ended {
				continue
			}
			if err := d.end(b); err != nil {
				return err
			}
		}
		return errStop
	case "error":
		return streamError(ev.Error, data)
	}
	return nil
}

func (d *decoder) start(index int, cb *contentBlock) error {
	if _, dup := d.blocks[index]; dup {
		return sse.Malformed("content_block_start for block %d twice", index)
	}
	b := &block{n: index}
	d.blocks[index] = b
	d.order = append(d.order, b)
	switch cb.Type {
	case "text":
		b.typ = omni.TypeText
		return d.text(b, cb.Text)
	case "thinking":
		b.typ = omni.TypeThinking
		b.sig.WriteString(cb.Signature)
		return d.text(b, cb.Thinking)
	case "redacted_thinking":
		b.typ = omni.TypeThinking
		b.redacted = cb.Data
		fid, _ := json.Marshal(fidelity{RedactedData: cb.Data})
		b.emitted = true
		return d.emit(model.Delta{Block: b.n, Type: b.typ, Fidelity: fid})
	case "tool_use":
		if cb.Name == "" {
			return sse.Malformed("tool_use block %d without name", index)
		}
		b.typ = omni.TypeToolCall
		b.name = cb.Name
		b.id = d.ids.Assign(cb.ID)
		b.input = cb.Input
		b.emitted = true
		return d.emit(model.Delta{Block: b.n, Type: b.typ, Name: b.name, ToolCallID: b.id})
	}
	return nil
}

// text emits a text or thinking fragment; empty fragments are skipped so
// that a block without content produces no message.
func (d *decoder) text(b *block, s string) error {
	if s == "" {
		return nil
	}
	b.emitted = true
	return d.emit(model.Delta{Block: b.n, Type: b.typ, Text: s})
}

func (d *decoder) delta(index int, dl *eventDelta) error {
	b := d.blocks[index]
	if b == nil || b.ended {
		return sse.Malformed("content_block_delta for block %d that is not open", index)
	}
	switch {
	case dl.Type == "text_delta" && b.typ == omni.TypeText:
		return d.text(b, dl.Text)
	case dl.Type == "thinking_delta" && b.typ == omni.TypeThinking:
		return d.text(b, dl.Thinking)
	case dl.Type == "signature_delta" && b.typ == omni.TypeThinking:
		b.sig.WriteString(dl.Signature)
	case dl.Type == "input_json_delta" && b.typ == omni.TypeToolCall:
		if dl.PartialJSON == "" {
			return nil
		}
		b.args += len(dl.PartialJSON)
		return d.emit(model.Delta{Block: b.n, Type: b.typ, Text: dl.PartialJSON, Name: b.name, ToolCallID: b.id})
	}
	return nil // citations_delta, server tool input, …
}

// end closes b. Thinking gets its signature as fidelity; a tool call that
// streamed no arguments gets its start input, or "{}".
func (d *decoder) end(b *block) error {
	b.ended = true
	last := model.Delta{Block: b.n, Type: b.typ, End: true}
	switch b.typ {
	case "":
		return nil
	case omni.TypeThinking:
		if b.sig.Len() > 0 {
			fid, _ := json.Marshal(fidelity{Signature: b.sig.String()})
			last.Fidelity = fid
			if !b.emitted {
				// A signed block with no visible thinking still has to be
				// replayed, so it becomes an empty thinking message.
				b.emitted = true
				if err := d.emit(model.Delta{Block: b.n, Type: b.typ, Fidelity: fid}); err != nil {
					return err
				}
			}
		} else if b.redacted != "" {
			last.Fidelity, _ = json.Marshal(fidelity{RedactedData: b.redacted})
		}
	case omni.TypeToolCall:
		if b.args == 0 {
			args := "{}"
			if in := bytes.TrimSpace(b.input); len(in) > 1 && in[0] == '{' && string(in) != "{}" {
				var buf bytes.Buffer
				if json.Compact(&buf, in) == nil {
					args = buf.String()
				}
			}
			if err := d.emit(model.Delta{Block: b.n, Type: b.typ, Text: args, Name: b.name, ToolCallID: b.id}); err != nil {
				return err
			}
		}
		last.Name, last.ToolCallID = b.name, b.id
	}
	if !b.emitted {
		return nil
	}
	return d.emit(last)
}

func (d *decoder) setUsage(u *usage) {
	set := func(dst *int64, src *int64) {
		if src != nil {
			*dst = *src
		}
	}
	set(&d.input, u.InputTokens)
	set(&d.output, u.OutputTokens)
	set(&d.cacheWrite, u.CacheCreationInputTokens)
	set(&d.cacheRead, u.CacheReadInputTokens)
}

func (d *decoder) result() model.Result {
	stop := omni.StatusCompleted
	if d.stop == "refusal" {
		stop = omni.StatusFailed
	}
	return model.Result{
		Usage: omni.Usage{
			CacheRead:  d.cacheRead,
			CacheWrite: d.cacheWrite,
			Output:     d.output,
			Total:      d.input + d.cacheWrite + d.cacheRead + d.output,
		},
		StopReason: stop,
	}
}

// errorStatus maps the error types of the API to the HTTP statuses they
// stand for, so an error event is classified like the same rejection
// before the stream began (protocol.md §6).
var errorStatus = map[string]int{
	"invalid_request_error": http.StatusBadRequest,
	"authentication_error":  http.StatusUnauthorized,
	"billing_error":         http.StatusPaymentRequired,
	"permission_error":      http.StatusForbidden,
	"not_found_error":       http.StatusNotFound,
	"request_too_large":     http.StatusRequestEntityTooLarge,
	"rate_limit_error":      http.StatusTooManyRequests,
	"api_error":             http.StatusInternalServerError,
	"timeout_error":         http.StatusGatewayTimeout,
	"overloaded_error":      529,
}

// streamError maps an error event: overloaded_error, api_error,
// rate_limit_error and timeout_error are timeout, authentication_error is
// auth, any other (or unknown) type is failed.
func streamError(e *apiError, data []byte) *model.Error {
	if e == nil {
		return &model.Error{Status: omni.StatusFailed, Message: sse.Truncate("error event: " + string(data))}
	}
	msg := sse.ErrorText(data)
	if code, ok := errorStatus[e.Type]; ok {
		return &model.Error{Status: sse.StatusForHTTP(code, data), Message: msg}
	}
	return &model.Error{Status: omni.StatusFailed, Message: msg}
}
