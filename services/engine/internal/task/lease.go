package task

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// ErrLeaseLost means another engine took the Task over (this one stalled
// past its ack wait): the Runner stopped without publishing more, and its
// task message must be neither acked nor naked.
var ErrLeaseLost = errors.New("task: lease lost to another engine")

// lease fences a Task to one engine: take writes a fresh token into the
// Session record, and the Task may publish only while the record still
// names its Task and token. A stalled engine that lost the Task to a
// redelivery finds another token and stops.
//
// Concurrency: Run calls take, watch and stop on its goroutine; valid is
// called by every producer of the Task from any goroutine. token, lose,
// beatKey and newKey are written by take before any other goroutine of
// the Task starts and only read after. The watcher goroutine is owned by
// the lease: watch starts it, stop ends and joins it (idempotent). lost
// and checked are atomics; nothing here takes a lock.
type lease struct {
	sessions *bus.Sessions
	sid      string
	taskID   string
	stale    time.Duration // how old a confirmation may be before valid asks again

	token   string
	beatKey string                  // the Session's BeatKey, read (or created) by take
	newKey  bool                    // take created it: earlier deliveries' jobs have tokens of no key
	lose    context.CancelCauseFunc // ends the lease scope with ErrLeaseLost
	lost    atomic.Bool             // lose was called with ErrLeaseLost
	checked atomic.Int64            // unix nanos of the last confirmation

	stopOnce sync.Once
	stopCh   chan struct{}
	done     chan struct{}
}

func newLease(sessions *bus.Sessions, sid, taskID string, ackWait time.Duration) *lease {
	stale := 10 * time.Second
	if ackWait > 0 {
		// A third of the ack wait: after a stall long enough to lose the
		// Task (SIGSTOP, a frozen VM) the first publish verifies
		// ownership before anything reaches the stream.
		stale = ackWait / 3
	}
	return &lease{sessions: sessions, sid: sid, taskID: taskID, stale: stale,
		stopCh: make(chan struct{}), done: make(chan struct{})}
}

// take writes a new token into the Session record if it still names the
// Task (and the Session's BeatKey, when it has none yet), and returns the
// lease scope derived from ctx, which ends when the
// lease is lost (cause ErrLeaseLost) or release is called. It returns
// ErrLeaseLost when the record names another Task.
func (l *lease) take(ctx context.Context) (context.Context, error) {
	token := randomHex(8)
	if _, err := l.sessions.Update(ctx, l.sid, func(rec *omni.SessionRecord) error {
		if rec.TaskID != l.taskID {
			return ErrLeaseLost
		}
		rec.Lease = token
		l.beatKey, l.newKey = rec.BeatKey, false
		if rec.BeatKey == "" {
			rec.BeatKey = randomHex(32)
			l.beatKey, l.newKey = rec.BeatKey, true
		}
		return nil
	}); err != nil {
		return nil, err
	}
	lctx, lose := context.WithCancelCause(ctx)
	l.token, l.lose = token, lose
	l.checked.Store(time.Now().UnixNano())
	return lctx, nil
}

// release ends the lease scope (Run's last step).
func (l *lease) release() {
	if l.lose != nil {
		l.lose(nil)
	}
}

// watch starts the watcher: every second (or stale/2, if shorter) it
// checks that the Session record still names this Task and token, and ends
// the lease scope with ErrLeaseLost when it does not. ctx is the lease
// scope.
func (l *lease) watch(ctx context.Context) {
	go func() {
		defer close(l.done)
		tick := time.NewTicker(min(time.Second, l.stale/2))
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-l.stopCh:
				return
			case <-ctx.Done():
				return
			}
			rec, _, err := l.sessions.Get(ctx, l.sid)
			if err == nil && (rec.TaskID != l.taskID || rec.Lease != l.token) {
				rec, _, err = l.sessions.GetLatest(ctx, l.sid) // not a lagging replica's word
			}
			if err != nil {
				continue // the bus is briefly unavailable; the ack wait covers it
			}
			if rec.TaskID != l.taskID || rec.Lease != l.token {
				l.lostLease()
				return
			}
			l.checked.Store(time.Now().UnixNano())
		}
	}()
}

// stop ends the watcher started by watch and waits for it; safe to call
// more than once.
func (l *lease) stop() {
	l.stopOnce.Do(func() { close(l.stopCh) })
	<-l.done
}

// valid reports whether this Runner still owns the Task. Cheap while the
// watcher confirms it every second; after a stall it asks the Session
// record itself and, on loss, ends the lease scope. A nil lease (a Runner
// not started through Run: benchmarks) is always valid.
func (l *lease) valid() bool {
	if l == nil || l.lose == nil {
		return true
	}
	if l.lost.Load() {
		return false
	}
	if time.Since(time.Unix(0, l.checked.Load())) < l.stale {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, _, err := l.sessions.GetLatest(ctx, l.sid)
	if err != nil {
		return true // cannot tell; the watcher keeps checking
	}
	if rec.TaskID != l.taskID || rec.Lease != l.token {
		l.lostLease()
		return false
	}
	l.checked.Store(time.Now().UnixNano())
	return true
}

// lostLease records that another engine owns the Task and ends the lease
// scope (and with it the abort scope) with ErrLeaseLost.
func (l *lease) lostLease() {
	l.lost.Store(true)
	l.lose(ErrLeaseLost)
}

// tokenOf is the lease token ("" for a nil lease).
func (l *lease) tokenOf() string {
	if l == nil {
		return ""
	}
	return l.token
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
