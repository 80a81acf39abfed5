package fold

import (
	"fmt"

	"floe.dev/pkg/omni"
)

// State is a Context as plain data, for a context snapshot (package
// snapshot stores it in msgpack). Messages are their OmniMessage JSON: the
// codec re-encodes a decoded message byte for byte, so a Context restored
// from a State hands the model exactly the messages the fold kept.
//
// Every field of Context that Apply reads or writes is here; a change to
// Context's fields changes State and must bump snapshot.Version.
type State struct {
	Meta  []byte          `msgpack:"meta,omitempty"`
	Tools []omni.ToolSpec `msgpack:"tools,omitempty"`

	Entries []StateEntry `msgpack:"entries,omitempty"`
	Open    *StateTurn   `msgpack:"open,omitempty"`

	Usage            omni.Usage `msgpack:"usage"`
	LastRequestTotal int64      `msgpack:"last_request_total"`
	Turns            int64      `msgpack:"turns"`
	TotalTurns       int64      `msgpack:"total_turns"`

	Compacting     bool   `msgpack:"compacting"`
	CompactionText string `msgpack:"compaction_text,omitempty"`
	AttemptText    string `msgpack:"attempt_text,omitempty"`
	AttemptOpen    bool   `msgpack:"attempt_open"`
	// BeginReason and BeginMode are the open compaction_begin's (all that
	// is read of it: PendingCompaction).
	BeginReason string `msgpack:"begin_reason,omitempty"`
	BeginMode   string `msgpack:"begin_mode,omitempty"`
	Summary     string `msgpack:"summary,omitempty"`
	Compactions int    `msgpack:"compactions"`
	Closed      bool   `msgpack:"closed"`
	Records     int    `msgpack:"records"`
}

// StateEntry is one entry of the context: a user message or a committed
// turn.
type StateEntry struct {
	Msg  []byte     `msgpack:"msg,omitempty"`
	Turn *StateTurn `msgpack:"turn,omitempty"`
}

// StateTurn is a request's messages: Outputs[i] is the output of Calls[i],
// nil while none has arrived.
type StateTurn struct {
	Assistant   [][]byte `msgpack:"assistant"`
	Calls       []string `msgpack:"calls,omitempty"`
	Outputs     [][]byte `msgpack:"outputs,omitempty"`
	Interrupted []string `msgpack:"interrupted,omitempty"`
}

// State returns c as plain data. It fails only when a message does not
// encode (none that the fold kept from decoded records can).
func (c *Context) State() (*State, error) {
	s := &State{
		Tools:            c.Tools,
		Usage:            c.Usage,
		LastRequestTotal: c.LastRequestTotal,
		Turns:            c.Turns,
		TotalTurns:       c.TotalTurns,
		Compacting:       c.Compacting,
		CompactionText:   c.compactionText,
		AttemptText:      c.attemptText.String(),
		AttemptOpen:      c.attemptOpen,
		BeginReason:      c.compactionBegin.Reason,
		BeginMode:        c.compactionBegin.Mode,
		Summary:          c.Summary,
		Compactions:      c.Compactions,
		Closed:           c.Closed,
		Records:          c.Records,
	}
	var err error
	if c.Meta != nil {
		if s.Meta, err = omni.Marshal(c.Meta); err != nil {
			return nil, fmt.Errorf("fold: encode session_meta: %w", err)
		}
	}
	s.Entries = make([]StateEntry, c.log.length())
	c.log.each(func(i int, e entry) {
		switch {
		case err != nil:
		case e.msg != nil:
			if s.Entries[i].Msg, err = omni.Marshal(e.msg); err != nil {
				err = fmt.Errorf("fold: encode entry %d: %w", i, err)
			}
		default:
			if s.Entries[i].Turn, err = e.turn.state(); err != nil {
				err = fmt.Errorf("fold: encode entry %d: %w", i, err)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	if c.open != nil {
		if s.Open, err = c.open.state(); err != nil {
			return nil, fmt.Errorf("fold: encode the open request: %w", err)
		}
	}
	return s, nil
}

func (t *turn) state() (*StateTurn, error) {
	st := &StateTurn{Assistant: make([][]byte, len(t.assistant)), Calls: t.calls}
	var err error
	for i, m := range t.assistant {
		if st.Assistant[i], err = omni.Marshal(m); err != nil {
			return nil, err
		}
	}
	if len(t.outputs) > 0 {
		st.Outputs = make([][]byte, len(t.outputs))
		for i, m := range t.outputs {
			if m == nil {
				continue
			}
			if st.Outputs[i], err = omni.Marshal(m); err != nil {
				return nil, err
			}
		}
	}
	for _, id := range t.calls {
		if t.interrupted[id] != nil {
			st.Interrupted = append(st.Interrupted, id)
		}
	}
	return st, nil
}

// Restore returns the Context s describes. It fails on a message that does
// not decode or a turn whose calls and outputs disagree: a snapshot that
// is not a Context's, which the caller replaces by a full fold.
func Restore(s *State) (*Context, error) {
	c := New()
	c.Tools = s.Tools
	c.Usage = s.Usage
	c.LastRequestTotal = s.LastRequestTotal
	c.Turns, c.TotalTurns = s.Turns, s.TotalTurns
	c.Compacting = s.Compacting
	c.compactionText = s.CompactionText
	c.attemptText.WriteString(s.AttemptText)
	c.attemptOpen = s.AttemptOpen
	c.compactionBegin = omni.Payload{Reason: s.BeginReason, Mode: s.BeginMode}
	c.setSummary(s.Summary)
	c.Compactions = s.Compactions
	c.Closed = s.Closed
	c.Records = s.Records
	var err error
	if s.Meta != nil {
		if c.Meta, err = decodeMsg(s.Meta); err != nil {
			return nil, fmt.Errorf("fold: session_meta: %w", err)
		}
	}
	for i, e := range s.Entries {
		switch {
		case e.Msg != nil && e.Turn == nil:
			m, err := decodeMsg(e.Msg)
			if err != nil {
				return nil, fmt.Errorf("fold: entry %d: %w", i, err)
			}
			c.log.add(entry{msg: m})
		case e.Turn != nil && e.Msg == nil:
			t, err := restoreTurn(e.Turn, c.log.gen)
			if err != nil {
				return nil, fmt.Errorf("fold: entry %d: %w", i, err)
			}
			// As RequestEnd does (a later turn's call id wins).
			c.log.add(entry{turn: t})
		default:
			return nil, fmt.Errorf("fold: entry %d is neither a message nor a turn", i)
		}
	}
	if s.Open != nil {
		if c.open, err = restoreTurn(s.Open, c.log.gen); err != nil {
			return nil, fmt.Errorf("fold: the open request: %w", err)
		}
	}
	return c, nil
}

func restoreTurn(st *StateTurn, gen uint64) (*turn, error) {
	if len(st.Outputs) != 0 && len(st.Outputs) != len(st.Calls) {
		return nil, fmt.Errorf("%d outputs for %d calls", len(st.Outputs), len(st.Calls))
	}
	t := &turn{gen: gen, assistant: make([]*omni.Message, len(st.Assistant)), calls: st.Calls, outputs: make([]*omni.Message, len(st.Calls))}
	var err error
	for i, b := range st.Assistant {
		if t.assistant[i], err = decodeMsg(b); err != nil {
			return nil, err
		}
		if t.assistant[i].Payload.Type == omni.TypeToolCall {
			t.toolCalls++
		}
	}
	// Calls of one id share one output message, as attach makes them.
	byID := map[string]*omni.Message{}
	for i, b := range st.Outputs {
		if b == nil {
			continue
		}
		if m := byID[t.calls[i]]; m != nil {
			t.outputs[i] = m
			continue
		}
		if t.outputs[i], err = decodeMsg(b); err != nil {
			return nil, err
		}
		byID[t.calls[i]] = t.outputs[i]
	}
	for _, id := range st.Interrupted {
		t.interrupt(id)
	}
	return t, nil
}

func decodeMsg(b []byte) (*omni.Message, error) {
	m := new(omni.Message)
	if err := omni.Unmarshal(b, m); err != nil {
		return nil, err
	}
	return m, nil
}

// Clone returns a Context that folds on independently of c: O(1) when c
// owns its entries (a Context from New, Load or Restore, as the snapshot
// cache is). The two share every entry and message; whichever changes a
// shared turn copies it first, and neither ever sees the other's changes
// (entries.go).
func (c *Context) Clone() *Context {
	n := &Context{
		Meta:             c.Meta,
		Tools:            c.Tools,
		log:              c.log.clone(),
		open:             c.open, // shared: each copies it before a change (openTurn)
		Usage:            c.Usage,
		LastRequestTotal: c.LastRequestTotal,
		Turns:            c.Turns,
		TotalTurns:       c.TotalTurns,
		Compacting:       c.Compacting,
		compactionText:   c.compactionText,
		attemptOpen:      c.attemptOpen,
		compactionBegin:  c.compactionBegin,
		Summary:          c.Summary,
		summaryMsg:       c.summaryMsg,
		summaryOf:        c.summaryOf,
		Compactions:      c.Compactions,
		Closed:           c.Closed,
		Records:          c.Records,
	}
	n.attemptText.WriteString(c.attemptText.String())
	return n
}
