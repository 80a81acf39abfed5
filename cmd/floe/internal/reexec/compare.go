package reexec

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// Normalize is a record as the comparison sees it: its JSON without the
// timestamp, the Session's own ids (session_meta's session_id and
// workspace and forked_from, a subagent pointer's child id) and the retry
// wait (the ladder's timing, not behaviour). forked_from names the parent
// a fork was cut from (protocol.md §3): the replay's Session is not a fork,
// and that pointer is an id, not behaviour.
func Normalize(m omni.Message) string {
	m.Timestamp = ""
	switch {
	case m.Type == omni.KindSessionMeta:
		m.Payload.SessionID, m.Payload.Workspace = "", ""
	case m.Payload.Type == omni.TypeSubagent:
		m.Payload.SessionID = ""
	case m.Payload.Type == omni.TypeRequestEnd:
		m.Payload.RetryInMs = 0
	}
	b, err := omni.Marshal(&m)
	if err != nil {
		return fmt.Sprintf("<unencodable: %v>", err)
	}
	if m.Type == omni.KindSessionMeta {
		return withoutForkedFrom(b)
	}
	return string(b)
}

// withoutForkedFrom drops payload.forked_from from a session_meta's JSON
// (every session_meta goes through it, so both sides of a comparison
// have its keys sorted alike).
func withoutForkedFrom(b []byte) string {
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		return string(b)
	}
	if p, ok := rec["payload"].(map[string]any); ok {
		delete(p, "forked_from")
	}
	out, err := json.Marshal(rec)
	if err != nil {
		return string(b)
	}
	return string(out)
}

// FirstDiff returns the index of the first record where want and got
// part (normalized), or -1 when they are equal.
func FirstDiff(want, got []omni.Message) int {
	for i := range min(len(want), len(got)) {
		if Normalize(want[i]) != Normalize(got[i]) {
			return i
		}
	}
	if len(want) != len(got) {
		return min(len(want), len(got))
	}
	return -1
}

// PrintDiff writes the first difference of a re-execution with context
// records around it: "  " both, "- " recorded, "+ " replayed.
func PrintDiff(w io.Writer, want, got []omni.Message, at, context int) {
	if at < 0 {
		fmt.Fprintf(w, "equal: %d records\n", len(want))
		return
	}
	fmt.Fprintf(w, "first difference at record %d (recorded %d records, replayed %d)\n", at+1, len(want), len(got))
	for i := max(0, at-context); i < at; i++ {
		fmt.Fprintf(w, "  %d %s\n", i+1, Normalize(want[i]))
	}
	for i := at; i < min(at+context+1, len(want)); i++ {
		fmt.Fprintf(w, "- %d %s\n", i+1, Normalize(want[i]))
	}
	for i := at; i < min(at+context+1, len(got)); i++ {
		fmt.Fprintf(w, "+ %d %s\n", i+1, Normalize(got[i]))
	}
}

// A pacer counts each replayed Session's Trace-class messages as the
// stream takes them, so the replay provider and toolrunner can wait for
// a record's recorded position. It follows the replay's Session from the
// start and a subagent child once something waits on it, and keeps the
// subagent pointers each Session published (the children, in order).
//
// It also keeps which replayed tool calls have stalled for an abort (the
// replay toolrunner's Stalled), keyed "<session>/<tool_call_id>".
type pacer struct {
	bound time.Duration
	mu    sync.Mutex
	n     map[string]int      // by Session
	kids  map[string][]string // by Session: its children, in pointer order
	grew  chan struct{}       // closed and replaced whenever any of it grows
	stall map[string]bool

	ctx      context.Context // set by start: where follows run
	st       *stack.Stack
	followed map[string]bool
	follows  sync.WaitGroup
}

func newPacer(bound time.Duration) *pacer {
	return &pacer{bound: bound, grew: make(chan struct{}), n: make(map[string]int), kids: make(map[string][]string),
		stall: make(map[string]bool), followed: make(map[string]bool)}
}

// start follows sessionID on st until ctx ends (and later any Session
// waited on); stop with ctx, then join with done.
func (p *pacer) start(ctx context.Context, st *stack.Stack, sessionID string) {
	p.mu.Lock()
	p.ctx, p.st = ctx, st
	p.mu.Unlock()
	p.ensure(sessionID)
}

// done waits for every follow to end (after start's ctx ended).
func (p *pacer) done() { p.follows.Wait() }

// ensure follows sessionID if it is not followed yet.
func (p *pacer) ensure(sessionID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.st == nil || p.followed[sessionID] || p.ctx.Err() != nil {
		return
	}
	p.followed[sessionID] = true
	p.follows.Add(1)
	go func() {
		defer p.follows.Done()
		p.follow(p.ctx, p.st, sessionID)
	}()
}

// broadcastLocked wakes every waiter; p.mu is held.
func (p *pacer) broadcastLocked() {
	close(p.grew)
	p.grew = make(chan struct{})
}

// stalled records that a replayed call waits for its abort.
func (p *pacer) stalled(sid, callID string) {
	p.mu.Lock()
	p.stall[sid+"/"+callID] = true
	p.broadcastLocked()
	p.mu.Unlock()
}

// count is how many records of sessionID the stream holds so far.
func (p *pacer) count(sessionID string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[sessionID]
}

// waitAbort is wait with the bound of waitStall: an abort sent early
// would cut the replay short (a busy machine can take seconds to start
// the replay's first Task).
func (p *pacer) waitAbort(ctx context.Context, sid string, n int) error {
	p.ensure(sid)
	return p.untilFor(ctx, 10*p.bound, func() bool { return p.n[sid] >= n })
}

// waitStall returns once the call key has stalled, after ten times the
// bound, or when ctx ends (then with its error): a call the replay
// dispatches late (a busy machine, a toolrunner still starting) must not
// be aborted before it runs; one the replay never dispatches costs that
// wait once.
func (p *pacer) waitStall(ctx context.Context, key string) error {
	return p.untilFor(ctx, 10*p.bound, func() bool { return p.stall[key] })
}

// follow counts sessionID's Trace-class messages until ctx ends.
func (p *pacer) follow(ctx context.Context, st *stack.Stack, sessionID string) {
	_ = bus.FollowUntil(ctx, st.JS, sessionID, omni.TraceClasses, 0, false, func(sm bus.StreamMsg) error {
		var child string
		if m, err := omni.Decode(sm.Data); err == nil && m.Type == omni.KindEvent && m.Payload.Type == omni.TypeSubagent && len(m.Origin) == 0 {
			child = m.Payload.SessionID
		}
		p.mu.Lock()
		p.n[sessionID]++
		if child != "" {
			p.kids[sessionID] = append(p.kids[sessionID], child)
		}
		p.broadcastLocked()
		p.mu.Unlock()
		return nil
	})
}

// wait returns once sessionID's stream holds n records, after the bound,
// or when ctx ends (then with its error).
func (p *pacer) wait(ctx context.Context, sessionID string, n int) error {
	p.ensure(sessionID)
	return p.until(ctx, func() bool { return p.n[sessionID] >= n })
}

// until returns once done (called under p.mu) holds, after the bound, or
// when ctx ends (then with its error).
func (p *pacer) until(ctx context.Context, done func() bool) error {
	return p.untilFor(ctx, p.bound, done)
}

func (p *pacer) untilFor(ctx context.Context, bound time.Duration, done func() bool) error {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		p.mu.Lock()
		ok, grew := done(), p.grew
		p.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-grew:
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
