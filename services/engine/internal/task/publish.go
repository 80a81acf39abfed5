package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/publish"
	"floe.dev/pkg/omni"
)

// pubJS is the JetStream the Task's publishers use.
func (d *Deps) pubJS() jetstream.JetStream {
	if d.PubJS != nil {
		return d.PubJS
	}
	return d.JS
}

// A Task publishes through three producers (pkg/bus/publish), the only
// ways its messages reach FLOE_SESSIONS, each fenced by the Task's lease:
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
// (forwardChild).
func (r *Runner) openPublishers() {
	o := r.publishOptions()
	r.pub = publish.New(r.d.pubJS(), o)
	r.out = publish.New(r.d.pubJS(), o)
	r.srv = publish.New(r.d.pubJS(), o)
}

// publishOptions are the options of every producer of the Task.
func (r *Runner) publishOptions() publish.Options {
	return publish.Options{Fence: r.leaseValid, AckTimeout: r.d.Settings.PublishAckTimeout, SyncDeadline: r.d.Settings.PublishSyncDeadline}
}

// closePublishers commits what is queued and stops the producers.
func (r *Runner) closePublishers() {
	for _, p := range []*publish.Publisher{r.pub, r.out, r.srv} {
		if p != nil {
			p.Close()
		}
	}
}

// settle waits until everything the Task queued is stored (per-Task
// settling: no other Task's publishes are waited for) and logs a loss.
func (r *Runner) settle(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, p := range []*publish.Publisher{r.pub, r.out, r.srv} {
		if _, err := p.Settle(ctx); err != nil {
			r.log.Error().Err(err).Msg("part of the Task's messages were not stored")
		}
	}
}

// settleResume waits until everything on the Task's stream is stored and
// returns a loss, resuming the stream after it: for a step that fails as a
// whole (a compaction) and then goes on publishing.
func (r *Runner) settleResume(ctx context.Context) error {
	_, err := r.pub.Settle(ctx)
	if err != nil && !errors.Is(err, publish.ErrFenced) {
		r.pub.Resume()
	}
	return err
}

func (r *Runner) apply(m *omni.Message) {
	r.mu.Lock()
	r.fc.Apply(m)
	r.mu.Unlock()
}

// publish queues m on the Task's stream and folds it. msgID, when set, is
// its Nats-Msg-Id. It waits only while the producer's queue is full
// (back-pressure). A message the stream did not store fails the request
// it belongs to at the request's settle (see request), whose retry
// restores what was lost; nothing after a lost message is stored.
func (r *Runner) publish(m *omni.Message, msgID string) {
	r.publishClass(m, omni.ClassOf(m), msgID)
}

// publishClass is publish on an explicit subject class (trace: Trace-only
// records, never streamed), in the same order as everything else the Task
// publishes.
func (r *Runner) publishClass(m *omni.Message, class, msgID string) {
	if !r.leaseValid() {
		return
	}
	r.apply(m)
	nm, err := bus.SessionMsgClass(r.sid, class, m, msgID)
	if err == nil {
		err = r.pub.Publish(context.Background(), nm)
	}
	if err != nil {
		r.log.Error().Err(err).Msg("publish to FLOE_SESSIONS failed")
	}
}

// publishOnce publishes m with a Msg-Id on the Task's stream, waiting until
// it is stored, and folds it unless the stream already had it when the
// Runner read the history (a redelivered Task), which it reports. A
// duplicate stored after that read is the Runner's own message, stored by
// a try whose ack was lost (the publisher sent it again): it is folded.
func (r *Runner) publishOnce(ctx context.Context, m *omni.Message, msgID string) (dup bool, err error) {
	nm, err := bus.SessionMsg(r.sid, m, msgID)
	if err != nil {
		return false, err
	}
	ack, err := r.pub.Sync(ctx, nm)
	if err != nil {
		return false, fmt.Errorf("publish %s: %w", m.Payload.Type, err)
	}
	dup = ack.Duplicate && ack.Seq <= r.replayed
	if !dup {
		r.apply(m)
	}
	return dup, nil
}

// publishSync publishes m and waits until the stream stored it and
// everything its producer published before. With a msgID (a tool output)
// it goes through the outputs producer, retried until stored; without,
// through the Task's stream. m is folded only when the stream took it: a
// duplicate Msg-Id (another publisher's output for the same call got there
// first) never reaches the context.
func (r *Runner) publishSync(ctx context.Context, m *omni.Message, msgID string) error {
	if !r.leaseValid() {
		return ErrLeaseLost
	}
	nm, err := bus.SessionMsg(r.sid, m, msgID)
	if err != nil {
		return err
	}
	p := r.pub
	if msgID != "" {
		p = r.out
	}
	ack, err := p.Sync(ctx, nm)
	if err != nil {
		return fmt.Errorf("publish %s: %w", m.Payload.Type, err)
	}
	if !ack.Duplicate {
		r.apply(m)
	}
	return nil
}

// server publishes a server event and waits until it is stored.
func (r *Runner) server(ctx context.Context, ev omni.ServerEvent, msgID string) (uint64, error) {
	if !r.leaseValid() {
		return 0, ErrLeaseLost
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return 0, err
	}
	nm := nats.NewMsg(omni.SessionSubject(r.sid, omni.ClassServer))
	nm.Data = b
	if msgID != "" {
		nm.Header.Set("Nats-Msg-Id", msgID)
	}
	ack, err := r.srv.Sync(ctx, nm)
	if err != nil {
		if errors.Is(err, publish.ErrFenced) {
			return 0, ErrLeaseLost
		}
		// A lost server event is not part of any request: the next one
		// goes out.
		r.srv.Resume()
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
func (r *Runner) unfinished(ctx context.Context, from uint64) (open []*openSegment, stored map[string]bool, err error) {
	byKey := map[string]*openSegment{}
	var order []string
	stored = map[string]bool{}
	// The read must reach what the stream's leader holds: the consumer
	// that reads may sit on a replica that has not applied it yet (after a
	// leader change), and a segment start it misses would stay open.
	var through, seen uint64
	for _, class := range []string{omni.ClassPartial, omni.ClassModel} {
		last, lerr := bus.LastStored(ctx, r.d.JS, omni.SessionSubject(r.sid, class))
		if lerr != nil {
			return nil, nil, lerr
		}
		through = max(through, last)
	}
	err = bus.Follow(ctx, r.d.JS, r.sid, []string{omni.ClassPartial, omni.ClassModel}, from, true, func(sm bus.StreamMsg) error {
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
func (r *Runner) closeUnfinished(ctx context.Context, from uint64) (map[string]bool, error) {
	open, stored, err := r.unfinished(ctx, from)
	if err != nil {
		return nil, err
	}
	for _, s := range open {
		p := s.start.Payload
		typ := omni.CompleteType(p.Type)
		if !s.stopped {
			stop := omni.Partial(typ, omni.EventStop, "", p.Name, p.ToolCallID)
			r.publish(&stop, "")
		}
		var m omni.Message
		switch typ {
		case omni.TypeToolCall:
			m = omni.ToolCall(p.Name, string(s.content), p.ToolCallID)
		case omni.TypeThinking:
			m = omni.Thinking(string(s.content))
		default:
			m = omni.Text(omni.RoleAssistant, string(s.content))
		}
		m.Payload.StopReason = omni.StatusFailed
		r.publish(&m, "")
	}
	return stored, nil
}

// attemptMsgID is the Nats-Msg-Id stem of the messages of attempt n of a
// request, which started after the producer's sequence from-1. The lease
// tells apart the Runners of one Task (one that took it over starts with a
// producer that published nothing, as the first did).
func (r *Runner) attemptMsgID(from uint64, attempt int) string {
	return fmt.Sprintf("%s/%s/a%d-%d", r.task.ID, r.lease, from, attempt)
}

// recoverAttempt runs after the Task's stream lost a message of the
// attempt that started after sequence from: it resumes the producer,
// closes the attempt's open segments with what the stream holds, and
// publishes the attempt's token_usage and request_end (idempotently:
// Msg-Ids of the attempt), retrying the whole until the stream takes it or
// a minute passes. It returns the tool calls of the attempt the stream
// holds.
func (r *Runner) recoverAttempt(ctx context.Context, from uint64, attempt int, tu, end *omni.Message) map[string]bool {
	deadline := time.Now().Add(time.Minute)
	wait := 200 * time.Millisecond
	base := r.attemptMsgID(from, attempt)
	for {
		r.pub.Resume()
		stored, err := r.closeUnfinished(ctx, from)
		if err == nil {
			if _, err = r.publishOnce(ctx, tu, base+"/usage"); err == nil {
				_, err = r.publishOnce(ctx, end, base+"/end")
			}
		}
		if err == nil {
			return stored
		}
		if errors.Is(err, publish.ErrFenced) || ctx.Err() != nil || time.Now().After(deadline) {
			r.log.Error().Err(err).Msg("could not close the failed attempt on the stream")
			return stored
		}
		r.log.Warn().Err(err).Msg("closing the failed attempt; retrying")
		time.Sleep(wait)
		wait = min(2*wait, 2*time.Second)
	}
}
