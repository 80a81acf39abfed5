// Package purge removes ended Tasks' partial messages from FLOE_SESSIONS
// once a grace period has passed (FLOE_PARTIALS_KEEP, default 1 h): the
// complete messages and the Trace keep everything a reader or a resume
// needs, and the partials were most of a long Session's stored bytes.
//
// At a Task's end, while it still holds the Session, the engine reads the
// sequence of the Session's last partial message: every partial at or
// below it belongs to this Task or an earlier one (no other Task of the
// Session can run before this one releases it), so a purge of the
// Session's partial subject up to it never removes a message of a running
// Task.
//
// Idle Sessions (SetIdle, FLOE_IDLE_KEEP, default 1 h) leave the stream
// altogether: once a Session has run no Task for the keep after its last
// message, every message of it (all classes) is removed from
// FLOE_SESSIONS, because its Trace holds its history (SPEC §5) and an
// empty stream's file block is removed where a block holding one live
// message keeps every byte written to it. When one is due the Purger, in
// this order: reads the record (idle) and the Session's last sequence L,
// and the record again (the same revision: no Task began in between);
// waits until the tracer's durable consumer has acknowledged the
// Session's last Trace-class message (no tracer consumer: no purge);
// brings the Session's context snapshot up to L (snapshot.Store.Cover);
// writes PurgedThrough = L into the record with a compare-and-set on the
// revision read first (a Task that began since changed it: no purge);
// and only then purges the Session's subjects below L+1. A crash between
// the last two leaves a record that names messages still held, never a
// gap the record does not name.
//
// Pending purges live in this engine's memory and are found again from
// the stream when an engine starts (Recover): every Session that still
// has partials and runs no Task has them purged a grace period after its
// last one, so a restart, or an engine that never comes back, leaves
// nothing behind. (The Session's next Task's purge also removes every
// partial below its own end.)
package purge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// DefaultKeep is how long an ended Task's partials stay by default.
const DefaultKeep = time.Hour

// Purger purges ended Tasks' partials after Keep, and idle Sessions'
// messages after the idle keep (SetIdle). Create with New, call Run on a
// goroutine the owner waits for, Ended for each Task end with partials
// and TaskEnded for each Task end.
type Purger struct {
	js   jetstream.JetStream
	keep time.Duration // negative: partials are kept
	log  zerolog.Logger
	now  func() time.Time
	idle *Idle // nil: Sessions stay on the stream

	mu     sync.Mutex
	due    []item          // in due order; mu
	queued map[string]bool // Sessions with an idle item in due; mu
	wake   chan struct{}   // 1-buffered: an item was added
}

type item struct {
	sid  string
	upTo uint64 // purge the partials below this sequence
	at   time.Time
	idle bool // an idle Session's messages, not partials
}

// DefaultIdleKeep is how long a Session stays on the stream by default
// after its last message when it runs no Task.
const DefaultIdleKeep = time.Hour

// DefaultTracer is the tracer's durable consumer name.
const DefaultTracer = "floe-tracer"

// Idle configures the purge of idle Sessions.
type Idle struct {
	// Keep is how long after its last message an idle Session stays.
	Keep time.Duration
	// Records reads and writes Session records (bus.Sessions).
	Records IdleRecords
	// Snapshots, when set, brings a Session's context snapshot up to
	// its last message before it is purged.
	Snapshots Coverer
	// Tracer is the tracer's durable consumer (default DefaultTracer).
	Tracer string
}

// IdleRecords reads Session records and writes one with a compare-and-set
// (bus.Sessions).
type IdleRecords interface {
	Records
	SetAt(ctx context.Context, r *omni.SessionRecord, rev uint64) error
}

// Coverer stores a Session's context snapshot covering the stream up to
// its end (snapshot.Store).
type Coverer interface {
	Cover(ctx context.Context, sid string, created int64, purged uint64) (uint64, error)
}

// New returns a Purger that keeps partials keep after their Task ended
// (negative: for ever).
func New(js jetstream.JetStream, keep time.Duration, log zerolog.Logger) *Purger {
	return &Purger{js: js, keep: keep, log: log, now: time.Now, wake: make(chan struct{}, 1), queued: map[string]bool{}}
}

// SetIdle turns the purge of idle Sessions on; call it before Recover and
// Run.
func (p *Purger) SetIdle(idle Idle) {
	if idle.Tracer == "" {
		idle.Tracer = DefaultTracer
	}
	p.idle = &idle
}

// Ended records that the Session's partials below upTo belong to Tasks
// that have ended (now).
func (p *Purger) Ended(sid string, upTo uint64) {
	if upTo == 0 || p.keep < 0 {
		return
	}
	p.add(item{sid: sid, upTo: upTo, at: p.now().Add(p.keep)})
}

// TaskEnded records that a Task of the Session ended (now): the Session
// leaves the stream once it has been idle the idle keep.
func (p *Purger) TaskEnded(sid string) {
	if p.idle == nil {
		return
	}
	p.add(item{sid: sid, idle: true, at: p.now().Add(p.idle.Keep)})
}

// add puts it into due in due order (an idle item only when the Session
// has none: its check finds the Session's last message itself).
func (p *Purger) add(it item) {
	p.mu.Lock()
	if it.idle {
		if p.queued[it.sid] {
			p.mu.Unlock()
			return
		}
		p.queued[it.sid] = true
	}
	i, _ := slices.BinarySearchFunc(p.due, it.at, func(a item, t time.Time) int {
		if a.at.After(t) {
			return 1
		}
		return -1
	})
	p.due = slices.Insert(p.due, i, it)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Records reads Session records and their revisions (bus.Sessions).
type Records interface {
	Get(ctx context.Context, id string) (*omni.SessionRecord, uint64, error)
}

// Recover finds the purges an engine that stopped left pending: every
// Session with partials in FLOE_SESSIONS whose record shows no Task or
// compaction running gets its partials up to its last one purged Keep
// after that last one was stored (a Task ends right after its last model
// output). The record is read before and after the last partial: the
// same revision means no Task began in between, so every partial up to
// it belongs to an ended Task (a Task claims the record before it
// publishes anything). A Session running a Task is left to that Task's
// end. It returns how many Sessions it scheduled; a Session it cannot
// read is skipped with a log line.
//
// With SetIdle, every Session with a message on the stream is checked as
// an idle item at once (the check schedules it its keep after its last
// message, or drops it when a Task runs): the scan is one stream info
// listing the stream's subjects.
func (p *Purger) Recover(ctx context.Context, records Records) (int, error) {
	stream, err := p.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return 0, fmt.Errorf("purge: recover: %w", err)
	}
	filter := omni.SessionSubject("*", omni.ClassPartial)
	if p.idle != nil {
		filter = omni.SessionSubjects
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("purge: recover: subjects %s: %w", filter, err)
	}
	var found []item
	for subject := range info.State.Subjects {
		sid, class, ok := omni.ParseSessionSubject(subject)
		if !ok {
			continue
		}
		if p.idle != nil {
			p.add(item{sid: sid, idle: true, at: p.now()})
		}
		if class != omni.ClassPartial || p.keep < 0 {
			continue
		}
		it, ok, err := p.pending(ctx, records, sid)
		if err != nil {
			if ctx.Err() != nil {
				return len(found), ctx.Err()
			}
			p.log.Warn().Err(err).Str("session_id", sid).Msg("cannot recover a pending purge")
			continue
		}
		if ok {
			found = append(found, it)
		}
	}
	if len(found) == 0 {
		return 0, nil
	}
	p.mu.Lock()
	p.due = append(p.due, found...)
	slices.SortStableFunc(p.due, func(a, b item) int { return a.at.Compare(b.at) })
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return len(found), nil
}

// pending is the purge of sid's partials that an ended Task left, if its
// record shows none running across the read of its last partial.
func (p *Purger) pending(ctx context.Context, records Records, sid string) (item, bool, error) {
	idle := func() (uint64, bool, error) {
		r, rev, err := records.Get(ctx, sid)
		if err != nil {
			return 0, false, err
		}
		return rev, !r.Deleted && (r.State == "" || r.State == omni.StateIdle), nil
	}
	rev, ok, err := idle()
	if err != nil || !ok {
		return item{}, false, ignoreGone(err)
	}
	// From the stream's leader (STREAM.MSG.GET, which the engine's
	// permissions allow; not a direct get by subject).
	last, at, err := bus.LastStoredAt(ctx, p.js, omni.SessionSubject(sid, omni.ClassPartial))
	if err != nil || last == 0 {
		return item{}, false, err
	}
	rev2, ok, err := idle()
	if err != nil || !ok || rev2 != rev {
		return item{}, false, ignoreGone(err)
	}
	return item{sid: sid, upTo: last + 1, at: at.Add(p.keep)}, true, nil
}

// ignoreGone is nil for a Session deleted meanwhile.
func ignoreGone(err error) error {
	if err == nil || errors.Is(err, bus.ErrSessionNotFound) {
		return nil
	}
	return err
}

// Run purges what is due until ctx ends. A purge that fails is logged
// and not retried: the Session's next Task end purges everything below it.
func (p *Purger) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		var next item // a copy: Recover may sort p.due in place meanwhile
		pending := len(p.due) > 0
		if pending {
			next = p.due[0]
		}
		p.mu.Unlock()
		if pending {
			if wait := next.at.Sub(p.now()); wait > 0 {
				timer.Reset(wait)
			} else {
				p.mu.Lock()
				it := p.due[0]
				p.due = p.due[1:]
				if it.idle {
					delete(p.queued, it.sid)
				}
				p.mu.Unlock()
				if it.idle {
					if again := p.session(ctx, it.sid); !again.IsZero() && ctx.Err() == nil {
						p.add(item{sid: it.sid, idle: true, at: again})
					}
					continue
				}
				if err := Partials(ctx, p.js, it.sid, it.upTo); err != nil && ctx.Err() == nil {
					p.log.Warn().Err(err).Str("session_id", it.sid).Uint64("seq", it.upTo).Msg("cannot purge an ended Task's partials")
				}
				continue
			}
		} else {
			timer.Reset(time.Hour)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
		}
	}
}

// Partials removes the Session's partial messages below sequence upTo
// from FLOE_SESSIONS.
func Partials(ctx context.Context, js jetstream.JetStream, sid string, upTo uint64) error {
	stream, err := js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return fmt.Errorf("purge: %s: %w", sid, err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(omni.SessionSubject(sid, omni.ClassPartial)), jetstream.WithPurgeSequence(upTo)); err != nil {
		return fmt.Errorf("purge: partials of %s below %d: %w", sid, upTo, err)
	}
	return nil
}

// retry is how long an idle purge that cannot proceed yet waits.
func (p *Purger) retry() time.Duration {
	return min(max(p.idle.Keep/4, 100*time.Millisecond), time.Minute)
}

// session purges the idle Session's messages when it is due and safe (see
// the package doc), and returns when to check it again (zero: no more;
// its next Task's end schedules it again).
func (p *Purger) session(ctx context.Context, sid string) time.Time {
	log := p.log.With().Str("session_id", sid).Logger()
	later := p.now().Add(p.retry())
	idle := func() (*omni.SessionRecord, uint64, bool, error) {
		r, rev, err := p.idle.Records.Get(ctx, sid)
		if err != nil {
			return nil, 0, false, ignoreGone(err)
		}
		return r, rev, !r.Deleted && (r.State == "" || r.State == omni.StateIdle), nil
	}
	rec, rev, ok, err := idle()
	if err != nil {
		log.Warn().Err(err).Msg("idle purge: cannot read the record")
		return later
	}
	if !ok {
		return time.Time{} // gone, or a Task runs: its end schedules it
	}
	last, at, err := bus.LastStoredAt(ctx, p.js, omni.SessionWildcard(sid))
	if err != nil {
		log.Warn().Err(err).Msg("idle purge: cannot read the Session's last message")
		return later
	}
	if last == 0 || last <= rec.PurgedThrough {
		return time.Time{} // nothing of it left on the stream
	}
	if due := at.Add(p.idle.Keep); due.After(p.now()) {
		return due
	}
	_, rev2, ok, err := idle()
	if err != nil || !ok || rev2 != rev {
		log.Debug().Err(err).Msg("idle purge: the record changed meanwhile; checking again later")
		return later
	}
	if traced, err := p.traced(ctx, sid, last); err != nil || !traced {
		log.Debug().Err(err).Uint64("seq", last).Msg("idle purge: the tracer has not written the Session yet; checking again later")
		return later
	}
	if p.idle.Snapshots != nil {
		if _, err := p.idle.Snapshots.Cover(ctx, sid, rec.CreatedUnixMs, rec.PurgedThrough); err != nil {
			// The next Task folds the Trace instead: slower, not wrong.
			log.Warn().Err(err).Msg("idle purge: cannot store the context snapshot")
		}
	}
	rec.PurgedThrough = last
	if err := p.idle.Records.SetAt(ctx, rec, rev); err != nil {
		if errors.Is(err, bus.ErrConflict) {
			log.Debug().Msg("idle purge: the record changed meanwhile; checking again later")
		} else {
			log.Warn().Err(err).Msg("idle purge: cannot record the purge")
		}
		return later
	}
	stream, err := p.js.Stream(ctx, omni.SessionsStream)
	if err == nil {
		err = stream.Purge(ctx, jetstream.WithPurgeSubject(omni.SessionWildcard(sid)), jetstream.WithPurgeSequence(last+1))
	}
	if err != nil {
		// The record says purged; the messages stay until the next try.
		log.Warn().Err(err).Uint64("seq", last).Msg("idle purge: cannot purge the Session's messages")
		return later
	}
	log.Debug().Uint64("seq", last).Msg("idle Session purged from the stream")
	return time.Time{}
}

// traced reports whether the tracer's durable consumer has acknowledged
// every Trace-class message of the Session up to last (false when there
// is no tracer consumer).
func (p *Purger) traced(ctx context.Context, sid string, last uint64) (bool, error) {
	cons, err := p.js.Consumer(ctx, omni.SessionsStream, p.idle.Tracer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	floor := cons.CachedInfo().AckFloor.Stream
	if floor >= last {
		return true, nil
	}
	for _, class := range omni.TraceClasses {
		seq, err := bus.LastStored(ctx, p.js, omni.SessionSubject(sid, class))
		if err != nil {
			return false, err
		}
		if seq > floor {
			return false, nil
		}
	}
	return true, nil
}
