package reexec

import (
	"context"
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
// workspace, a subagent pointer's child id) and the retry wait (the
// ladder's timing, not behaviour).
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
	return string(b)
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

// A pacer counts the replayed Session's Trace-class messages as the
// stream takes them, so the replay provider and toolrunner can wait for
// a record's recorded position.
//
// It also keeps which replayed tool calls have stalled for an abort (the
// replay toolrunner's Stalled), keyed "<session>/<tool_call_id>".
type pacer struct {
	bound time.Duration
	mu    sync.Mutex
	n     int
	grew  chan struct{} // closed and replaced whenever n or stalls grows
	stall map[string]bool
}

func newPacer(bound time.Duration) *pacer {
	return &pacer{bound: bound, grew: make(chan struct{}), stall: make(map[string]bool)}
}

// stalled records that a replayed call waits for its abort.
func (p *pacer) stalled(sid, callID string) {
	p.mu.Lock()
	p.stall[sid+"/"+callID] = true
	close(p.grew)
	p.grew = make(chan struct{})
	p.mu.Unlock()
}

// waitAbort is wait with the bound of waitStall: an abort sent early
// would cut the replay short (a busy machine can take seconds to start
// the replay's first Task).
func (p *pacer) waitAbort(ctx context.Context, n int) error {
	return p.untilFor(ctx, 10*p.bound, func() bool { return p.n >= n })
}

// waitStall returns once the call key has stalled, after the bound, or
// when ctx ends (then with its error).
//
// Its bound is ten times the pacer's: a call the replay dispatches late (a
// busy machine, a toolrunner still starting) must not be aborted before
// it runs; one the replay never dispatches costs that wait once.
func (p *pacer) waitStall(ctx context.Context, key string) error {
	return p.untilFor(ctx, 10*p.bound, func() bool { return p.stall[key] })
}

// follow counts the Session's Trace-class messages until ctx ends.
func (p *pacer) follow(ctx context.Context, st *stack.Stack, sid string) {
	_ = bus.FollowUntil(ctx, st.JS, sid, omni.TraceClasses, 0, false, func(bus.StreamMsg) error {
		p.mu.Lock()
		p.n++
		close(p.grew)
		p.grew = make(chan struct{})
		p.mu.Unlock()
		return nil
	})
}

// wait returns once n records are in the stream, after the bound, or when
// ctx ends (then with its error).
func (p *pacer) wait(ctx context.Context, _ string, n int) error {
	return p.until(ctx, func() bool { return p.n >= n })
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
