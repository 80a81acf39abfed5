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
// Pending purges live in this engine's memory. When it stops before a
// grace period ends, that Task's partials go with the Session's next
// Task's purge, which removes every partial below its own end.
package purge

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

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

// Run purges what is due until ctx ends. A purge that fails is logged
// and not retried: the Session's next Task end purges everything below it.
func (p *Purger) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		var next *item
		if len(p.due) > 0 {
			next = &p.due[0]
		}
		p.mu.Unlock()
		if next != nil {
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
