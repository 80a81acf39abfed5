package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/publish"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
)

// pubJS is the JetStream the Task's publishers use.
func (d *Deps) pubJS() jetstream.JetStream {
	if d.PubJS != nil {
		return d.PubJS
	}
	return d.JS
}

// producers are the only ways the Task's messages reach FLOE_SESSIONS:
// three ordered producers (pkg/bus/publish), each fenced by the Task's
// lease.
//
//   - pub, the Task's own stream: session head, input, every request's
//     partials and messages, approval decisions, steering, compaction and
//     its output on the trace subject, abort. Its order is the stream's.
//   - out, the tool outputs the engine writes itself (denials, lost runners,
//     jobs that could not be enqueued, subagent answers): each has its
//     Nats-Msg-Id, so it is published idempotently after what the Task
//     published before it.
//   - srv, server events (task_state, approval requests, a child's
//     approval requests surfaced here).
//
// Nested forwarding of a subagent gets a producer of its own per child
// (nested). Everything published on pub or out is folded into the
// history; a request's end and an attempt's loss are recovered here
// (closeRequest, publishDecision).
//
// Concurrency: any goroutine of the Task may publish; pkg/bus/publish
// orders each producer's messages. The fields are set by newProducers and
// open (Run, before any other goroutine of the Task starts) and never
// written after, except replayed (written by Run before the
// outputs consumer and the approval loops start) and the attempt markers,
// which are atomics: attemptFrom is the first stream sequence the current
// request attempt can have published at; inAttempt is true from an
// attempt's begin until its messages are settled (or its loss recovered),
// and only then may a loss be resumed by anyone but the request loop.
type producers struct {
	js       jetstream.JetStream // reads (unfinished)
	sid      string
	taskID   string
	log      zerolog.Logger
	lease    *lease
	hist     *history
	opts     publish.Options
	pubJS    jetstream.JetStream
	pub      *publish.Publisher
	out      *publish.Publisher
	srv      *publish.Publisher
	replayed uint64 // the last stream sequence of the history Run folded

	attemptFrom atomic.Uint64
	inAttempt   atomic.Bool
}

// newProducers prepares the Task's producers; open starts them (Run,
// once the lease is taken) and close stops them.
func newProducers(d *Deps, sid, taskID string, l *lease, h *history, log zerolog.Logger) *producers {
	p := &producers{js: d.JS, sid: sid, taskID: taskID, log: log, lease: l, hist: h, pubJS: d.pubJS()}
	p.opts = publish.Options{Fence: l.valid, AckTimeout: d.Settings.PublishAckTimeout, SyncDeadline: d.Settings.PublishSyncDeadline}
	return p
}

// open starts the three producers.
func (p *producers) open() {
	p.pub = publish.New(p.pubJS, p.opts)
	p.out = publish.New(p.pubJS, p.opts)
	p.srv = publish.New(p.pubJS, p.opts)
}

// nested opens a producer for one child's forwarded stream, with the same
// fence and limits; the caller closes it.
func (p *producers) nested() *publish.Publisher { return publish.New(p.pubJS, p.opts) }

// close commits what is queued and stops the producers.
func (p *producers) close() {
	for _, q := range []*publish.Publisher{p.pub, p.out, p.srv} {
		if q != nil {
			q.Close()
		}
	}
}

// settle waits until everything the Task queued is stored (per-Task
// settling: no other Task's publishes are waited for) and logs a loss.
func (p *producers) settle(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, q := range []*publish.Publisher{p.pub, p.out, p.srv} {
		if _, err := q.Settle(ctx); err != nil {
			p.log.Error().Err(err).Msg("part of the Task's messages were not stored")
		}
	}
}

// settleResume waits until everything on the Task's stream is stored and
// returns a loss, resuming the stream after it: for a step that fails as a
// whole (a compaction) and then goes on publishing.
func (p *producers) settleResume(ctx context.Context) error {
	_, err := p.pub.Settle(ctx)
	if err != nil && !errors.Is(err, publish.ErrFenced) {
		p.pub.Resume()
	}
	return err
}

// resumeAfterLoss settles the Task's stream and resumes it after a loss,
// so an earlier loss does not keep a new step (abort) off the stream.
func (p *producers) resumeAfterLoss(ctx context.Context) {
	if _, err := p.pub.Settle(ctx); err != nil {
		p.pub.Resume()
	}
}

// settleOrResume settles the Task's stream, resuming it after a loss, and
// returns the last sequence it stored: a new step (an attempt, abort)
// never inherits an earlier step's loss.
func (p *producers) settleOrResume(ctx context.Context) uint64 {
	from, err := p.pub.Settle(ctx)
	if err != nil {
		p.pub.Resume()
		from, _ = p.pub.Settle(ctx)
	}
	return from
}

// publish queues m on the Task's stream and folds it. msgID, when set, is
// its Nats-Msg-Id. It waits only while the producer's queue is full
// (back-pressure). A message the stream did not store fails the request
// it belongs to at the request's settle (see request), whose retry
// restores what was lost; nothing after a lost message is stored.
func (p *producers) publish(m *omni.Message, msgID string) {
	p.publishClass(m, omni.ClassOf(m), msgID)
}

// publishClass is publish on an explicit subject class (trace: Trace-only
// records, never streamed), in the same order as everything else the Task
// publishes.
func (p *producers) publishClass(m *omni.Message, class, msgID string) {
	if !p.lease.valid() {
		return
	}
	p.hist.apply(m)
	nm, err := bus.SessionMsgClass(p.sid, class, m, msgID)
	if err == nil {
		err = p.pub.Publish(context.Background(), nm)
	}
	if err != nil {
		p.log.Error().Err(err).Msg("publish to FLOE_SESSIONS failed")
	}
}

// publishOnce publishes m with a Msg-Id on the Task's stream, waiting until
// it is stored, and folds it unless the stream already had it when the
// Runner read the history (a redelivered Task), which it reports. A
// duplicate stored after that read is the Runner's own message, stored by
// a try whose ack was lost (the publisher sent it again): it is folded.
func (p *producers) publishOnce(ctx context.Context, m *omni.Message, msgID string) (dup bool, err error) {
	nm, err := bus.SessionMsg(p.sid, m, msgID)
	if err != nil {
		return false, err
	}
	ack, err := p.pub.Sync(ctx, nm)
	if err != nil {
		return false, fmt.Errorf("publish %s: %w", m.Payload.Type, err)
	}
	dup = ack.Duplicate && ack.Seq <= p.replayed
	if !dup {
		p.hist.apply(m)
	}
	return dup, nil
}

// publishSync publishes m and waits until the stream stored it and
// everything its producer published before. With a msgID (a tool output)
// it goes through the outputs producer, retried until stored; without,
// through the Task's stream. m is folded only when the stream took it: a
// duplicate Msg-Id (another publisher's output for the same call got there
// first) never reaches the context.
func (p *producers) publishSync(ctx context.Context, m *omni.Message, msgID string) error {
	if !p.lease.valid() {
		return ErrLeaseLost
	}
	nm, err := bus.SessionMsg(p.sid, m, msgID)
	if err != nil {
		return err
	}
	q := p.pub
	if msgID != "" {
		q = p.out
	}
	ack, err := q.Sync(ctx, nm)
	if err != nil {
		return fmt.Errorf("publish %s: %w", m.Payload.Type, err)
	}
	if !ack.Duplicate {
		p.hist.apply(m)
	}
	return nil
}

// server publishes a server event and waits until it is stored.
func (p *producers) server(ctx context.Context, ev omni.ServerEvent, msgID string) (uint64, error) {
	if !p.lease.valid() {
		return 0, ErrLeaseLost
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return 0, err
	}
	nm := nats.NewMsg(omni.SessionSubject(p.sid, omni.ClassServer))
	nm.Data = b
	if msgID != "" {
		nm.Header.Set("Nats-Msg-Id", msgID)
	}
	ack, err := p.srv.Sync(ctx, nm)
	if err != nil {
		if errors.Is(err, publish.ErrFenced) {
			return 0, ErrLeaseLost
		}
		// A lost server event is not part of any request: the next one
		// goes out.
		p.srv.Resume()
		return 0, fmt.Errorf("publish server event %s: %w", ev.Type, err)
	}
	return ack.Seq, nil
}

// openSegment is a segment of the Task's own model stream found on the
// stream without its complete message.
type openSegment struct {
	start   omni.Message // its start fragment
	content []byte
	stopped bool
}

// unfinished reads the Session's partial and model messages from sequence
// from on and returns the segments of the engine's own stream (not tool
// outputs, not nested) that have no complete message, in the order they
// started, and the ids of the tool calls whose complete (not failed)
// message is stored.
func (p *producers) unfinished(ctx context.Context, from uint64) (open []*openSegment, stored map[string]bool, err error) {
	byKey := map[string]*openSegment{}
	var order []string
	stored = map[string]bool{}
	// The read must reach what the stream's leader holds: the consumer
	// that reads may sit on a replica that has not applied it yet (after a
	// leader change), and a segment start it misses would stay open.
	var through, seen uint64
	for _, class := range []string{omni.ClassPartial, omni.ClassModel} {
		last, lerr := bus.LastStored(ctx, p.js, omni.SessionSubject(p.sid, class))
		if lerr != nil {
			return nil, nil, lerr
		}
		through = max(through, last)
	}
	err = bus.Follow(ctx, p.js, p.sid, []string{omni.ClassPartial, omni.ClassModel}, from, true, func(sm bus.StreamMsg) error {
		seen = max(seen, sm.Seq)
		m, derr := omni.Decode(sm.Data)
		if derr != nil || len(m.Origin) > 0 || m.Type != omni.KindModel {
			return nil
		}
		p := &m.Payload
		typ := p.Type
		if m.IsPartial() {
			typ = omni.CompleteType(p.Type)
		}
		if typ == omni.TypeToolCallOutput || typ == "" {
			return nil
		}
		key := typ + "\x00" + p.ToolCallID
		if !m.IsPartial() {
			delete(byKey, key)
			if typ == omni.TypeToolCall && p.Stop() == omni.StatusCompleted {
				stored[p.ToolCallID] = true
			}
			return nil
		}
		switch p.EventType {
		case omni.EventStart:
			byKey[key] = &openSegment{start: m, content: []byte(p.Content())}
			order = append(order, key)
		case omni.EventDelta:
			if s := byKey[key]; s != nil && !s.stopped {
				s.content = append(s.content, p.Content()...)
			}
		case omni.EventStop:
			if s := byKey[key]; s != nil {
				s.content = append(s.content, p.Content()...)
				s.stopped = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if through >= from && seen < through {
		return nil, nil, fmt.Errorf("read back the stream through seq %d, its leader holds %d: behind", seen, through)
	}
	listed := map[string]bool{}
	for _, k := range order {
		if s := byKey[k]; s != nil && !listed[k] {
			listed[k] = true
			open = append(open, s)
		}
	}
	return open, stored, nil
}

// closeUnfinished ends every segment of the engine's own stream left open
// from sequence from on: a stop when it has none, then its complete message
// with exactly what was stored and stop_reason failed, so the streaming
// discipline holds on a failed attempt too. It reports the tool calls whose
// complete message the stream holds.
func (p *producers) closeUnfinished(ctx context.Context, from uint64) (map[string]bool, error) {
	open, stored, err := p.unfinished(ctx, from)
	if err != nil {
		return nil, err
	}
	for _, s := range open {
		sp := s.start.Payload
		typ := omni.CompleteType(sp.Type)
		if !s.stopped {
			stop := omni.Partial(typ, omni.EventStop, "", sp.Name, sp.ToolCallID)
			p.publish(&stop, "")
		}
		var m omni.Message
		switch typ {
		case omni.TypeToolCall:
			m = omni.ToolCall(sp.Name, string(s.content), sp.ToolCallID)
		case omni.TypeThinking:
			m = omni.Thinking(string(s.content))
		default:
			m = omni.Text(omni.RoleAssistant, string(s.content))
		}
		m.Payload.StopReason = omni.StatusFailed
		p.publish(&m, "")
	}
	return stored, nil
}

// attemptMsgID is the Nats-Msg-Id stem of the messages of attempt n of a
// request, which started after the producer's sequence from-1. The lease
// tells apart the Runners of one Task (one that took it over starts with a
// producer that published nothing, as the first did).
func (p *producers) attemptMsgID(from uint64, attempt int) string {
	return fmt.Sprintf("%s/%s/a%d-%d", p.taskID, p.lease.tokenOf(), from, attempt)
}

// closeRequest stores the end of a request attempt that started after
// sequence from: its token_usage (tu, nil for none) and request_end, each
// with a Msg-Id of base, so a try whose ack was lost is stored once.
// Every end goes out this way and is confirmed before the caller goes on:
// a request_end lost with its batch (an ack timeout while the stream's
// leader changed) left the stream inside a request, and the retry's (or
// the next request's) request_begin followed it (a kill9 failover run).
//
// When lost (a message of the attempt was not stored), and before every
// try after a failed one, it resumes the producer and closes the
// attempt's open segments with what the stream holds (closeUnfinished),
// then publishes the end. It retries the whole until the stream takes it,
// the lease is lost, ctx ends or a minute passes, and returns the tool
// calls of the attempt the stream holds (nil when it never read them back)
// and, when the end is not stored, why: the caller must not begin another
// request then (a later Task closes this one, as one a dead engine left
// open).
func (p *producers) closeRequest(ctx context.Context, from uint64, base string, tu, end *omni.Message, lost bool) (map[string]bool, error) {
	readBack := lost
	stored, err := retry.Do(ctx, retry.Exponential(200*time.Millisecond, 2*time.Second), time.Minute, func() (map[string]bool, error) {
		var stored map[string]bool
		var err error
		if readBack {
			p.pub.Resume()
			stored, err = p.closeUnfinished(ctx, from)
		}
		readBack = true
		if err == nil && tu != nil {
			_, err = p.publishOnce(ctx, tu, base+"/usage")
		}
		if err == nil {
			_, err = p.publishOnce(ctx, end, base+"/end")
		}
		if errors.Is(err, publish.ErrFenced) || (err != nil && ctx.Err() != nil) {
			return stored, retry.Permanent(err)
		}
		return stored, err
	}, func(err error, _ time.Duration) {
		p.log.Warn().Err(err).Msg("request_end not stored; closing the request again")
	})
	return stored, err
}

// errCallLost: the stream lost a call's own message (its attempt failed).
var errCallLost = errors.New("the tool call's message was not stored")

// publishDecision publishes a call's approval decision on the Task's
// stream only if the call's message is stored. gen is the stream's
// generation before the call's message was queued and from the first
// sequence of its attempt: when a message the Task published since is lost
// (publish.ErrStale, or the decision's own failure), it waits until the
// request's recovery resumed the stream and reads the attempt back; a call
// that is on the stream gets its decision then, a call that is not gets
// none (errCallLost), and the caller drops it.
func (p *producers) publishDecision(ctx context.Context, ad *omni.Message, id string, gen, from uint64) error {
	deadline := time.Now().Add(time.Minute)
	for {
		nm, err := bus.SessionMsg(p.sid, ad, "")
		if err != nil {
			return err
		}
		if !p.lease.valid() {
			return ErrLeaseLost
		}
		_, err = p.pub.SyncAfter(ctx, nm, gen)
		if err == nil {
			p.hist.apply(ad)
			return nil
		}
		if errors.Is(err, publish.ErrFenced) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		p.log.Warn().Err(err).Str("tool_call_id", id).Msg("approval decision not stored; reading the call back")
		for p.pub.Failed() && ctx.Err() == nil && time.Now().Before(deadline) {
			if !p.inAttempt.Load() {
				// No request is streaming: the loss is not one a
				// request's recovery will handle.
				p.pub.Resume()
				break
			}
			_ = retry.Sleep(ctx, 50*time.Millisecond)
		}
		gen = p.pub.Token()
		// Only a successful read decides: during an election the read may
		// fail, and the call must not get a decision unless it is stored.
		var stored map[string]bool
		for {
			var rerr error
			if _, stored, rerr = p.unfinished(ctx, from); rerr == nil {
				break
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				return rerr
			}
			_ = retry.Sleep(ctx, 200*time.Millisecond)
		}
		if !stored[id] {
			return errCallLost
		}
	}
}

// publishDecisionOnce publishes a call's approval decision on the Task's
// stream, waiting until it is stored, only if nothing the Task published
// since generation gen (before the call's message was queued) was lost.
// Unlike publishDecision it does not wait for a loss to be recovered: it
// fails, and the caller leaves the call to the approval loop.
func (p *producers) publishDecisionOnce(ctx context.Context, ad *omni.Message, gen uint64) error {
	if !p.lease.valid() {
		return ErrLeaseLost
	}
	nm, err := bus.SessionMsg(p.sid, ad, "")
	if err != nil {
		return err
	}
	if _, err := p.pub.SyncAfter(ctx, nm, gen); err != nil {
		return err
	}
	p.hist.apply(ad)
	return nil
}

// awaitStored returns once the Task's stream holds everything queued
// before generation gen was taken, or, after a loss since, once the
// attempt's recovery has read back which calls the stream holds (the
// attempt is no longer in flight), or when actx ends.
func (p *producers) awaitStored(actx context.Context, gen uint64) {
	if _, err := p.pub.Settle(actx); err == nil && p.pub.Token() == gen {
		return
	}
	for p.inAttempt.Load() && actx.Err() == nil {
		_ = retry.Sleep(actx, 50*time.Millisecond)
	}
}

// publishOutput publishes a tool output the engine writes itself on the
// outputs producer, waiting until it is stored; it does not fold it (the
// caller records it, or the stored one, see calls.publishLost).
func (p *producers) publishOutput(ctx context.Context, out *omni.Message) (publish.Ack, error) {
	nm, err := bus.SessionMsg(p.sid, out, bus.OutputMsgID(p.sid, out.Payload.ToolCallID))
	if err != nil {
		return publish.Ack{}, err
	}
	return p.out.Sync(ctx, nm)
}

// token is the Task stream's generation (publish.Publisher.Token).
func (p *producers) token() uint64 { return p.pub.Token() }

// beginAttempt marks a request attempt in flight from sequence from.
func (p *producers) beginAttempt(from uint64) {
	p.attemptFrom.Store(from)
	p.inAttempt.Store(true)
}

// endAttempt marks the attempt's messages settled or its loss recovered.
func (p *producers) endAttempt() { p.inAttempt.Store(false) }

// settleStream waits until everything on the Task's stream is stored and
// returns a loss (leaving the stream failed: the request recovers it).
func (p *producers) settleStream(ctx context.Context) error {
	_, err := p.pub.Settle(ctx)
	return err
}

// resume lets the Task's stream take messages again after a loss.
func (p *producers) resume() { p.pub.Resume() }
