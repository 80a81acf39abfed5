// Package segment turns a provider's block deltas into OmniMessages with the
// streaming discipline of the seed: every segment is start → delta* → stop,
// its complete message right after, and segments never overlap even when
// the provider interleaves blocks (parallel tool-call argument fragments).
// A block that is not the open one is buffered and streamed, exactly, once
// the open one closes.
package segment

import (
	"encoding/json"
	"strings"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// Sink receives the messages in stream order. An error stops the stream.
type Sink func(m *omni.Message) error

// Segmenter serializes one request's deltas. Not safe for concurrent use.
type Segmenter struct {
	sink Sink
	ids  *model.IDAllocator

	blocks  map[int]*block
	pending []int // blocks seen but not yet streamed, in first-seen order
	current *block

	// Completed lists the complete messages emitted, in order.
	Completed []omni.Message
}

type block struct {
	idx      int
	typ      string
	name, id string
	content  strings.Builder
	streamed int // bytes of content already published
	fidelity json.RawMessage
	ended    bool
	done     bool
}

// New returns a Segmenter publishing to sink; ids assigns tool_call ids
// missing at a block's end.
func New(sink Sink, ids *model.IDAllocator) *Segmenter {
	return &Segmenter{sink: sink, ids: ids, blocks: make(map[int]*block)}
}

// Add takes one delta.
func (s *Segmenter) Add(d model.Delta) error {
	b := s.blocks[d.Block]
	if b == nil {
		b = &block{idx: d.Block, typ: d.Type}
		s.blocks[d.Block] = b
		s.pending = append(s.pending, d.Block)
	}
	if b.done {
		return nil // a provider repeating an ended block: ignore
	}
	if d.Name != "" {
		b.name = d.Name
	}
	if d.ToolCallID != "" {
		b.id = d.ToolCallID
	}
	if len(d.Fidelity) > 0 {
		b.fidelity = d.Fidelity
	}
	b.content.WriteString(d.Text)
	if d.End {
		b.ended = true
	}
	if s.current == nil {
		return s.advance()
	}
	if s.current == b {
		if err := s.flush(b); err != nil {
			return err
		}
		if b.ended {
			if err := s.close(b, ""); err != nil {
				return err
			}
			return s.advance()
		}
	}
	return nil
}

// advance opens the next pending block that can open, streams what it has,
// and keeps going while blocks are already complete.
func (s *Segmenter) advance() error {
	for s.current == nil && len(s.pending) > 0 {
		b := s.blocks[s.pending[0]]
		if b.typ == omni.TypeToolCall && b.name == "" && !b.ended {
			return nil // a tool call opens once its name is known
		}
		s.pending = s.pending[1:]
		s.current = b
		if err := s.open(b); err != nil {
			return err
		}
		if b.ended {
			if err := s.close(b, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Segmenter) open(b *block) error {
	if b.typ == omni.TypeToolCall && b.id == "" && s.ids != nil {
		b.id = s.ids.Assign("")
	}
	content := b.content.String()
	b.streamed = len(content)
	m := omni.Partial(b.typ, omni.EventStart, content, b.name, b.id)
	return s.sink(&m)
}

func (s *Segmenter) flush(b *block) error {
	content := b.content.String()
	if len(content) == b.streamed {
		return nil
	}
	frag := content[b.streamed:]
	b.streamed = len(content)
	m := omni.Partial(b.typ, omni.EventDelta, frag, b.name, b.id)
	return s.sink(&m)
}

// close ends the open block: stop fragment, then the complete message.
func (s *Segmenter) close(b *block, stopReason string) error {
	if err := s.flush(b); err != nil {
		return err
	}
	stop := omni.Partial(b.typ, omni.EventStop, "", b.name, b.id)
	if err := s.sink(&stop); err != nil {
		return err
	}
	var m omni.Message
	switch b.typ {
	case omni.TypeToolCall:
		m = omni.ToolCall(b.name, b.content.String(), b.id)
	case omni.TypeThinking:
		m = omni.Thinking(b.content.String())
	default:
		m = omni.Text(omni.RoleAssistant, b.content.String())
	}
	m.Payload.Fidelity = b.fidelity
	if stopReason != "" {
		m.Payload.StopReason = stopReason
	}
	b.done = true
	s.current = nil
	s.Completed = append(s.Completed, m)
	return s.sink(&m)
}

// Finish closes every block after the stream ended. stopReason is empty on
// success, else the failure status stamped on the complete messages of
// blocks the failure cut short.
func (s *Segmenter) Finish(stopReason string) error {
	for {
		if s.current != nil {
			reason := ""
			if !s.current.ended {
				reason = stopReason
			}
			if err := s.close(s.current, reason); err != nil {
				return err
			}
		}
		if len(s.pending) == 0 {
			return nil
		}
		b := s.blocks[s.pending[0]]
		s.pending = s.pending[1:]
		s.current = b
		if b.typ == omni.TypeToolCall && b.name == "" {
			b.name = "unknown"
		}
		if err := s.open(b); err != nil {
			return err
		}
	}
}
