// Package model is the engine's view of an LLM provider: one streaming
// request in, a sequence of block deltas out. Providers never retry; a
// failure is an *Error whose Status is the request's stop reason.
package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"floe.dev/pkg/omni"
)

// Request is one model request.
type Request struct {
	SessionID    string
	Model        string // model id, without the provider prefix
	SystemPrompt string
	// Messages is the model context in order: complete model_msg
	// messages only (user text/images, assistant thinking/text/tool_call,
	// tool_call_output), tool outputs already in call order.
	Messages      []*omni.Message
	Tools         []omni.ToolSpec
	ThinkingLevel string // "", "low", "medium", "high"
	// IDs allocates tool_call ids for providers that omit them or reuse
	// the function name; shared by every request of the Session.
	IDs *IDAllocator
	// Purpose is "" for a request of the agent loop (a turn or a
	// compaction) and PurposeTitle for the one-off request that names a
	// Session. Offline providers (scripted, demo, replay) answer a title
	// request without playing or consuming their script; HTTP providers
	// send it like any other.
	Purpose string
}

// PurposeTitle marks the one-off request for a Session's title (see
// TitlePrompt).
const PurposeTitle = "title"

// Delta is one piece of the model's output. Blocks are numbered by the
// provider and may interleave (parallel tool calls); the engine serializes
// them into non-overlapping segments.
type Delta struct {
	Block int    // provider block index, unique within the request
	Type  string // omni.TypeText, omni.TypeThinking or omni.TypeToolCall
	Text  string // the fragment: text, thinking, or tool arguments JSON
	// Name and ToolCallID identify a tool_call block; they may arrive on any
	// delta of the block (usually the first) and must be set by its End.
	Name       string
	ToolCallID string
	// End marks the block complete: no more deltas for Block.
	End bool
	// Fidelity is opaque provider data for the complete message (e.g. a
	// thinking signature), set on any delta of the block; the last wins.
	Fidelity json.RawMessage
}

// Result is what a completed stream reports.
type Result struct {
	Usage omni.Usage // this request's token counts
	// StopReason is the provider's finish reason mapped to omni (usually
	// completed).
	StopReason string
}

// Provider streams one request. It calls emit for each delta in order and
// returns when the stream ends. A failure returns *Error; deltas emitted
// before it stay valid (the engine closes their segments). If emit returns
// an error the provider stops and returns that error.
type Provider interface {
	Stream(ctx context.Context, req *Request, emit func(Delta) error) (Result, error)
}

// Info describes a model for session_meta.
type Info struct {
	Provider      string
	ModelID       string
	ContextWindow int64
}

// Error is a failed request: Status is one of omni.StatusFailed, Timeout,
// Malformed, Auth (protocol.md §6).
type Error struct {
	Status  string
	Message string
	// HTTPStatus is the provider's HTTP status, 0 when none.
	HTTPStatus int
	// MaxRetries, when above zero, bounds the retries of a request that
	// failed so, below the engine's ladder: a model server on this
	// machine that refuses connections is not starting in the next
	// minute.
	MaxRetries int
}

func (e *Error) Error() string {
	if e.HTTPStatus != 0 {
		return fmt.Sprintf("%s: HTTP %d: %s", e.Status, e.HTTPStatus, e.Message)
	}
	return e.Status + ": " + e.Message
}

// StatusOf maps any error from Stream to a stop reason: the *Error's Status,
// aborted for a cancelled context, failed otherwise.
func StatusOf(err error) string {
	var me *Error
	switch {
	case errors.As(err, &me):
		return me.Status
	case errors.Is(err, context.Canceled):
		return omni.StatusAborted
	case errors.Is(err, context.DeadlineExceeded):
		return omni.StatusTimeout
	}
	return omni.StatusFailed
}

// IDAllocator hands out Session-unique tool_call ids. Safe for concurrent use.
type IDAllocator struct {
	mu   sync.Mutex
	seen map[string]bool
	n    int
	used func(id string) bool // mu; nil: none
}

// SetUsed makes Assign ask used too whether an id is taken: the
// Session's context, looked up in O(1), instead of every id of it
// Observed at the Task's start. used must not call back into a.
func (a *IDAllocator) SetUsed(used func(id string) bool) {
	a.mu.Lock()
	a.used = used
	a.mu.Unlock()
}

// Assign returns id if it is non-empty and not yet used in the Session,
// otherwise a fresh id "call_<n>". Used ids are remembered.
func (a *IDAllocator) Assign(id string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen = make(map[string]bool)
	}
	taken := func(id string) bool { return a.seen[id] || a.used != nil && a.used(id) }
	if id != "" && !taken(id) {
		a.seen[id] = true
		return id
	}
	for {
		a.n++
		fresh := "call_" + strconv.Itoa(a.n)
		if !taken(fresh) {
			a.seen[fresh] = true
			return fresh
		}
	}
}

// Observe marks ids from an existing context as used.
func (a *IDAllocator) Observe(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen = make(map[string]bool)
	}
	a.seen[id] = true
}
