// Package replay is a model provider that serves a recorded Session's
// model answers from its Trace (protocol.md §8, floe replay --execute): the n-th
// request attempt of a Session gets the n-th request bracket of the
// record (request_begin … request_end, compaction requests included), its
// assistant messages as deltas, its usage, and its failure (a request_end
// that is not completed becomes the same *model.Error). Nothing goes to a
// network. Messages are paced to the record (Wait): each is emitted once
// the replayed Trace holds as many records as preceded it in the record,
// so tool outputs interleave with the model's messages as they did.
package replay

import (
	"context"
	"fmt"
	"os"
	"sync"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine/internal/model"
)

// Wait blocks until the replayed Session's Trace holds at least n
// records (or gives up, returning nil, so a replay that parts from the
// record still ends and shows where). nil: no pacing.
type Wait func(ctx context.Context, sessionID string, n int) error

// Children returns the record of a subagent child Session of the
// replay (its own Trace), or nil when sessionID is not one: the replay's
// own Session. It may wait for the replay to create the child.
type Children func(ctx context.Context, sessionID string) []omni.Message

// Provider serves the recorded attempts in order, per Session. A
// subagent's child Session (the replay's child inherits its model) is
// served from its own record, given by Children.
type Provider struct {
	info     model.Info
	attempts []attempt
	wait     Wait

	mu       sync.Mutex
	next     map[string]int // Session → its next attempt
	children Children
	child    map[string]*Provider // a child Session → its record's provider (nil: this one)
}

// SetChildren sets how a child Session's record is found (nil: every
// Session is served from this record).
func (p *Provider) SetChildren(c Children) {
	p.mu.Lock()
	p.children = c
	p.mu.Unlock()
}

// source is the provider of sessionID's record.
func (p *Provider) source(ctx context.Context, sessionID string) *Provider {
	p.mu.Lock()
	c := p.children
	src, seen := p.child[sessionID]
	p.mu.Unlock()
	if c == nil || seen {
		if src == nil {
			return p
		}
		return src
	}
	if recs := c(ctx, sessionID); recs != nil {
		if cp, err := New(recs, p.wait); err == nil {
			// The child serves itself; its own children are found
			// the same way.
			cp.children = c
			cp.child = map[string]*Provider{sessionID: nil}
			src = cp
		}
	}
	p.mu.Lock()
	if p.child == nil {
		p.child = make(map[string]*Provider)
	}
	if prev, ok := p.child[sessionID]; ok {
		src = prev
	} else {
		p.child[sessionID] = src
	}
	p.mu.Unlock()
	if src == nil {
		return p
	}
	return src
}

// A recorded request attempt.
type attempt struct {
	msgs   []recorded
	usage  omni.Usage
	status string
	errMsg string
	end    int // index of the record that closes the stream (token_usage, else request_end)
}

type recorded struct {
	at int // the record's index in the Trace
	m  omni.Message
}

// Open reads a recorded Trace (one JSONL file holding the Session's
// records in order; malformed lines are skipped as on resume).
func Open(path string, wait Wait) (*Provider, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer f.Close()
	msgs, _, err := trace.Read(f)
	if err != nil {
		return nil, fmt.Errorf("replay: read %s: %w", path, err)
	}
	return New(msgs, wait)
}

// New returns a Provider serving the requests of records.
func New(records []omni.Message, wait Wait) (*Provider, error) {
	p := &Provider{wait: wait, next: make(map[string]int)}
	var cur *attempt
	for i := range records {
		m := &records[i]
		pl := &m.Payload
		switch {
		case m.Type == omni.KindSessionMeta && p.info.ModelID == "":
			p.info = model.Info{Provider: pl.Provider, ModelID: pl.ModelID, ContextWindow: pl.ModelContextWindow}
		case m.Type == omni.KindEvent && pl.Type == omni.TypeRequestBegin:
			p.attempts = append(p.attempts, attempt{end: -1})
			cur = &p.attempts[len(p.attempts)-1]
		case cur == nil:
		case m.Type == omni.KindEvent && pl.Type == omni.TypeTokenUsage:
			if pl.Request != nil {
				cur.usage = *pl.Request
			}
			cur.end = i
		case m.Type == omni.KindEvent && pl.Type == omni.TypeRequestEnd:
			cur.status, cur.errMsg = pl.Status, pl.ErrorMessage
			if cur.end < 0 {
				cur.end = i
			}
			cur = nil
		case m.Type == omni.KindModel && pl.Role == omni.RoleAssistant &&
			(pl.Type == omni.TypeText || pl.Type == omni.TypeThinking || pl.Type == omni.TypeToolCall):
			cur.msgs = append(cur.msgs, recorded{at: i, m: *m})
		}
	}
	if p.info.ModelID == "" {
		return nil, fmt.Errorf("replay: the record holds no session_meta")
	}
	return p, nil
}

// Info is the recorded session_meta's model.
func (p *Provider) Info() model.Info { return p.info }

// Attempts is how many request attempts the record holds.
func (p *Provider) Attempts() int { return len(p.attempts) }

// Stream serves the Session's next recorded attempt. A title request
// (model.PurposeTitle) fails without taking an attempt: a Trace records
// none (the original writes none), so the replayed Session keeps its
// title and its requests stay in step with the record.
func (p *Provider) Stream(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	if req.Purpose == model.PurposeTitle {
		return model.Result{StopReason: omni.StatusFailed}, &model.Error{Status: omni.StatusFailed, Message: "replay: a Trace records no title requests"}
	}
	if src := p.source(ctx, req.SessionID); src != p {
		return src.Stream(ctx, req, emit)
	}
	p.mu.Lock()
	n := p.next[req.SessionID]
	p.next[req.SessionID] = n + 1
	p.mu.Unlock()
	if n >= len(p.attempts) {
		return model.Result{}, &model.Error{Status: omni.StatusFailed, Message: fmt.Sprintf("replay: the record holds %d requests; this is request %d", len(p.attempts), n+1)}
	}
	a := &p.attempts[n]
	for block, r := range a.msgs {
		if err := p.pace(ctx, req.SessionID, r.at); err != nil {
			return model.Result{}, err
		}
		pl := &r.m.Payload
		d := model.Delta{Block: block, Type: pl.Type, Name: pl.Name, ToolCallID: pl.ToolCallID}
		text := pl.Content()
		if pl.Type == omni.TypeToolCall {
			text = pl.Arguments
		}
		if text != "" {
			d.Text = text
			if err := emit(d); err != nil {
				return model.Result{}, err
			}
		}
		d.Text, d.End, d.Fidelity = "", true, pl.Fidelity
		if err := emit(d); err != nil {
			return model.Result{}, err
		}
	}
	if a.end >= 0 {
		if err := p.pace(ctx, req.SessionID, a.end); err != nil {
			return model.Result{}, err
		}
	}
	switch a.status {
	case omni.StatusCompleted:
		return model.Result{Usage: a.usage, StopReason: omni.StatusCompleted}, nil
	case omni.StatusAborted:
		// A user abort: the request stalls here until the replayer
		// sends the abort at the same point of the record (the abort
		// scope ends), then fails as an aborted stream does, with the
		// usage the record kept.
		<-ctx.Done()
		return model.Result{Usage: a.usage, StopReason: model.StatusOf(ctx.Err())}, ctx.Err()
	case "":
		if a.end >= 0 {
			// The record ends after the stream's token_usage, its
			// request_end lost: the stream itself had completed.
			return model.Result{Usage: a.usage, StopReason: omni.StatusCompleted}, nil
		}
		return model.Result{}, &model.Error{Status: omni.StatusFailed, Message: "replay: the record ends inside this request"}
	default:
		return model.Result{Usage: a.usage}, &model.Error{Status: a.status, Message: a.errMsg}
	}
}

func (p *Provider) pace(ctx context.Context, sid string, at int) error {
	if p.wait == nil {
		return nil
	}
	return p.wait(ctx, sid, at)
}
