package consume

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
)

// A Session whose Trace cannot be written (an unwritable file or
// directory) is set aside so that it never stops the others: its records
// are skipped by the loop, which goes on acknowledging the stream, and are
// written later by a catch-up that reads them back from FLOE_SESSIONS by
// subject, from the Session's recorded position to the last message the
// loop handled, retried with a backoff doubling from RetryMin to RetryMax.
// The set is kept in $FLOE_HOME/tracer/stuck, so a restarted tracer
// catches up the Sessions a previous one set aside (its records are
// acknowledged: the consumer does not bring them again).

// stuckSession is a Session whose Trace is behind.
type stuckSession struct {
	since    time.Time // stream time of its first record not written
	retry    time.Time
	failures int // failed catch-ups in a row: the next waits retry.Nth of it
	err      error
}

// Stuck describes a Session set aside, for metrics.
type Stuck struct {
	SessionID string
	Since     time.Time // stream time of its first record not written
}

func (r *runner) stuckPath() string { return filepath.Join(r.o.Home, "tracer", "stuck") }

// stick sets a Session aside after a failed write, or pushes its next
// retry further.
func (r *runner) stick(sid string, stored time.Time, err error) {
	st := r.stuck[sid]
	if st == nil {
		st = &stuckSession{since: stored, failures: 1}
		r.stuck[sid] = st
		r.log.Error().Err(err).Str("session_id", sid).Dur("retry_in", r.stuckWait(st)).
			Msg("cannot write this Session's Trace; its records are retried with backoff, the other Sessions go on")
		r.saveStuck()
	} else {
		st.failures++
		r.log.Warn().Err(err).Str("session_id", sid).Dur("retry_in", r.stuckWait(st)).Msg("still cannot write this Session's Trace")
	}
	st.err = err
	st.retry = time.Now().Add(r.stuckWait(st))
	r.reportStuck()
}

// stuckWait is the wait before st's next catch-up: RetryMin doubling per
// failure, capped at RetryMax.
func (r *runner) stuckWait(st *stuckSession) time.Duration {
	return retry.Nth(r.o.RetryMin, r.o.RetryMax, st.failures)
}

// retryStuck catches up every set-aside Session whose retry is due.
func (r *runner) retryStuck(ctx context.Context) error {
	now := time.Now()
	for sid, st := range r.stuck {
		if now.Before(st.retry) {
			continue
		}
		n, err := r.catchUp(ctx, sid, max(r.handled, r.floor))
		if err != nil {
			var crash *crashError
			if errors.As(err, &crash) || ctx.Err() != nil {
				return err
			}
			r.store.Forget(sid)
			r.stick(sid, st.since, err)
			continue
		}
		delete(r.stuck, sid)
		r.log.Info().Str("session_id", sid).Int("records", n).Msg("Session's Trace caught up")
		r.saveStuck()
		r.reportStuck()
	}
	return nil
}

// catchUp writes the Trace records of sid from its recorded position
// through stream sequence upTo, read from the stream by subject, and
// records the positions.
func (r *runner) catchUp(ctx context.Context, sid string, upTo uint64) (int, error) {
	from, err := r.store.Recorded(sid)
	if err != nil {
		return 0, err
	}
	if r.stream == nil {
		if r.stream, err = r.js.Stream(ctx, omni.SessionsStream); err != nil {
			return 0, fmt.Errorf("look up stream %s: %w", omni.SessionsStream, err)
		}
	}
	subject := omni.SessionWildcard(sid)
	n := 0
	for seq := from + 1; seq <= upTo; {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := r.stream.GetMsg(gctx, seq, jetstream.WithGetMsgSubject(subject))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("read back seq %d of %s: %w", seq, sid, err)
		}
		if m.Sequence > upTo {
			break
		}
		written, err := r.record(m.Subject, m.Data, m.Sequence, m.Time)
		if err != nil {
			return n, err
		}
		if written {
			n++
		}
		seq = m.Sequence + 1
	}
	if err := r.store.Flush(); err != nil {
		return n, err
	}
	return n, nil
}

// reportStuck hands the set to the metrics callback.
func (r *runner) reportStuck() {
	if r.o.Stuck == nil {
		return
	}
	out := make([]Stuck, 0, len(r.stuck))
	for sid, st := range r.stuck {
		out = append(out, Stuck{SessionID: sid, Since: st.since})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SessionID < out[j].SessionID })
	r.o.Stuck(out)
}

// saveStuck writes the set (one "<session id> <unix ns>" a line) through a
// temporary file; a failure is logged (the set is still in memory).
func (r *runner) saveStuck() {
	var b strings.Builder
	for sid, st := range r.stuck {
		fmt.Fprintf(&b, "%s %d\n", sid, st.since.UnixNano())
	}
	path := r.stuckPath()
	tmp := path + ".tmp"
	err := os.WriteFile(tmp, []byte(b.String()), 0o644)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		r.log.Warn().Err(err).Msg("cannot record the Sessions whose Trace is behind")
	}
}

// loadStuck reads the set a previous tracer left; each is retried at once.
func (r *runner) loadStuck() {
	f, err := os.Open(r.stuckPath())
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			r.log.Warn().Err(err).Msg("cannot read the Sessions whose Trace is behind")
		}
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sid, ns, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil || !omni.ValidSessionID(sid) {
			continue
		}
		r.stuck[sid] = &stuckSession{since: time.Unix(0, n), failures: 1, retry: time.Now()}
	}
	if len(r.stuck) > 0 {
		r.log.Warn().Int("sessions", len(r.stuck)).Msg("catching up the Traces a previous tracer set aside")
		r.reportStuck()
	}
}
