package omni

import (
	"slices"
	"strings"
)

// Aggregator folds partial_* fragments into in-progress messages, keyed by
// origin chain, payload type and tool_call_id. It serves a late joiner: Open
// returns one synthetic start fragment per segment still open, carrying
// everything streamed so far, so that fragment plus the live deltas that
// follow equal the complete message. The zero value is ready to use; it is
// not safe for concurrent use.
type Aggregator struct {
	open  map[string]*openSegment
	order []string
}

type openSegment struct {
	msg     Message
	content strings.Builder
}

// segmentKey joins origin hops, type and tool_call_id with NUL, which no
// Session id holds (ValidSessionID), so distinct origins never share a key.
func segmentKey(m *Message) string {
	typ := m.Payload.Type
	if c := CompleteType(typ); c != "" {
		typ = c
	}
	return strings.Join(m.Origin, "\x00") + "\x00" + typ + "\x00" + m.Payload.ToolCallID
}

// Add folds one message. Partials open, extend and close segments; a complete
// model message closes any segment left open with its key.
func (a *Aggregator) Add(m *Message) {
	if m.Type != KindModel {
		return
	}
	key := segmentKey(m)
	if !m.IsPartial() {
		a.close(key)
		return
	}
	switch m.Payload.EventType {
	case EventStart:
		if a.open == nil {
			a.open = make(map[string]*openSegment)
		}
		a.close(key)
		s := &openSegment{msg: *m}
		s.content.WriteString(m.Payload.Content())
		a.open[key] = s
		a.order = append(a.order, key)
	case EventDelta:
		if s := a.open[key]; s != nil {
			s.content.WriteString(m.Payload.Content())
		}
	case EventStop:
		if s := a.open[key]; s != nil {
			s.content.WriteString(m.Payload.Content())
		}
		a.close(key)
	}
}

func (a *Aggregator) close(key string) {
	if _, ok := a.open[key]; !ok {
		return
	}
	delete(a.open, key)
	for i, k := range a.order {
		if k == key {
			a.order = append(a.order[:i], a.order[i+1:]...)
			break
		}
	}
}

// Open returns one synthetic start fragment per open segment, in the order the
// segments started. The fragments share no memory with the Aggregator.
func (a *Aggregator) Open() []Message {
	out := make([]Message, 0, len(a.order))
	for _, k := range a.order {
		s := a.open[k]
		m := s.msg
		m.Origin = slices.Clone(m.Origin)
		m.Payload.EventType = EventStart
		m.Payload.SetContent(s.content.String())
		out = append(out, m)
	}
	return out
}

// Len returns the number of open segments.
func (a *Aggregator) Len() int { return len(a.order) }
