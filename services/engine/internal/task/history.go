package task

import (
	"sync"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/fold"
)

// history is the Session's folded context: the Trace and stream the Task
// read at its start, then everything it publishes or reads back (tool
// outputs), in that order.
//
// Concurrency: Run replays into it before any goroutine of the Task
// starts; afterwards the agent loop, the approval loop, subagent runs and
// the outputs consumer's callback all apply to it and read it. mu guards
// fc and is held only for one apply or one read, never across I/O.
type history struct {
	mu sync.Mutex
	fc *fold.Context
}

func newHistory() *history { return &history{fc: fold.New()} }

// apply folds m.
func (h *history) apply(m *omni.Message) {
	h.mu.Lock()
	h.fc.Apply(m)
	h.mu.Unlock()
}

// reset starts the fold over (a Trace replay that restarts).
func (h *history) reset() {
	h.mu.Lock()
	h.fc.Reset()
	h.mu.Unlock()
}

// restore makes fc the fold (a Task's start from a context snapshot).
func (h *history) restore(fc *fold.Context) {
	h.mu.Lock()
	h.fc = fc
	h.mu.Unlock()
}

// read runs f with the fold locked: f only reads.
func (h *history) read(f func(fc *fold.Context)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h.fc)
}

// hasCall reports whether a committed tool_call of the context has id.
func (h *history) hasCall(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fc.HasCall(id)
}

// messages is the model context folded so far.
func (h *history) messages() []*omni.Message {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fc.Messages()
}

// modelContext is the folded context with the carry-over of earlier
// interrupted runs inserted where it happened, plus extra model-only text.
func (h *history) modelContext(carry []omni.CarryItem, extra string) []*omni.Message {
	msgs := h.messages()
	if len(carry) > 0 {
		out := make([]*omni.Message, 0, len(msgs)+len(carry))
		ci := 0
		for i := 0; i <= len(msgs); i++ {
			for ci < len(carry) && carry[ci].At <= i {
				out = append(out, new(omni.UserText(carry[ci].Text)))
				ci++
			}
			if i < len(msgs) {
				out = append(out, msgs[i])
			}
		}
		msgs = out
	}
	if extra != "" {
		msgs = append(msgs, new(omni.UserText(extra)))
	}
	return msgs
}
