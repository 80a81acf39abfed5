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

// Purger purges ended Tasks' partials after Keep. Create with New, call
// Run on a goroutine the owner waits for, and Ended for each Task end.
type Purger struct {
	js   jetstream.JetStream
	keep time.Duration
	log  zerolog.Logger
	now  func() time.Time

	mu   sync.Mutex
	due  []item        // in due order (keep is the same for every item); mu
	wake chan struct{} // 1-buffered: an item was added
}

type item struct {
	sid  string
	upTo uint64 // purge the partials below this sequence
	at   time.Time
}

// New returns a Purger that keeps partials keep after their Task ended.
func New(js jetstream.JetStream, keep time.Duration, log zerolog.Logger) *Purger {
	return &Purger{js: js, keep: keep, log: log, now: time.Now, wake: make(chan struct{}, 1)}
}

// Ended records that the Session's partials below upTo belong to Tasks
// that have ended (now).
func (p *Purger) Ended(sid string, upTo uint64) {
	if upTo == 0 {
		return
	}
	p.mu.Lock()
	p.due = append(p.due, item{sid: sid, upTo: upTo, at: p.now().Add(p.keep)})
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
func (p *Purger) Recover(ctx context.Context, records Records) (int, error) {
	stream, err := p.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return 0, fmt.Errorf("purge: recover: %w", err)
	}
	filter := omni.SessionSubject("*", omni.ClassPartial)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("purge: recover: partial subjects: %w", err)
	}
	var found []item
	for subject := range info.State.Subjects {
		sid, _, ok := omni.ParseSessionSubject(subject)
		if !ok {
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
				p.mu.Unlock()
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
