package runner

import (
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// How long and how many cancels a runner remembers, so a job fetched after
// its cancel is dropped.
const (
	cancelTTL = 10 * time.Minute
	cancelMax = 10000
)

// cancelLoop serves cancel requests from ch until stop is closed. Every
// runner hears every cancel (no queue group): only the runner running a job
// can stop it, and every runner must remember the cancel in case it fetches
// the job later.
func (r *runner) cancelLoop(ch <-chan *nats.Msg, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case m := <-ch:
			r.onCancel(m)
		}
	}
}

// onCancel stops the named jobs of a Session (all of them when none is
// named), remembers the cancel, and — if it stopped any — replies with
// their ids once they can publish nothing more. A runner that stopped
// nothing stays silent.
func (r *runner) onCancel(m *nats.Msg) {
	sid, ok := strings.CutPrefix(m.Subject, omni.CancelSubject(""))
	if !ok || !omni.ValidSessionID(sid) {
		r.log.Warn().Str("subject", m.Subject).Msg("cancel on a malformed subject ignored")
		return
	}
	var c omni.Cancel
	if len(m.Data) > 0 {
		if err := omni.Unpack(m.Data, &c); err != nil {
			r.log.Warn().Err(err).Str("session_id", sid).Msg("undecodable cancel ignored")
			return
		}
	}
	names := make(map[string]bool, len(c.ToolCallIDs))
	for _, id := range c.ToolCallIDs {
		names[id] = true
	}

	var stopped []*job
	now := time.Now()
	r.mu.Lock()
	if len(names) == 0 {
		r.cancelled.addSession(sid, now)
	}
	for id := range names {
		r.cancelled.addCall(sid, id, now)
	}
	for key, j := range r.active {
		if j.sid != sid || (len(names) > 0 && !names[j.id]) {
			continue
		}
		if j.tryCancel() {
			stopped = append(stopped, j)
			// Gone from heartbeats at once: a heartbeat is published under
			// r.mu, so none naming the job can follow the reply.
			delete(r.active, key)
		}
	}
	r.mu.Unlock()

	ids := make([]string, len(stopped))
	for i, j := range stopped {
		ids[i] = j.id
	}
	r.log.Info().Str("session_id", sid).Strs("requested", c.ToolCallIDs).Strs("stopped", ids).Msg("cancel")
	if len(stopped) == 0 {
		return
	}
	r.goLoop(func() { r.replyCancel(m.Reply, sid, stopped, ids) })
}

// replyCancel waits, bounded, until the stopped jobs' goroutines have
// exited (their processes are gone) and their last partials are stored,
// publishes each one's aborted complete output, then replies to the cancel
// request.
func (r *runner) replyCancel(reply, sid string, stopped []*job, ids []string) {
	deadline := time.NewTimer(cancelWait)
	defer deadline.Stop()
wait:
	for _, j := range stopped {
		select {
		case <-j.done:
		case <-deadline.C:
			r.log.Warn().Str("session_id", sid).Str("tool_call_id", j.id).Msg("cancelled job still exiting; replying anyway")
			break wait
		}
	}
	// Each stopped job's segment is stored (repaired if the stream lost part
	// of it) and its aborted output after it, through the job's producer,
	// before the reply: the engine publishes abort only after it, so the
	// output precedes abort. The cancel took the producer over from the
	// job, so it closes it.
	for _, j := range stopped {
		j.settleSegment(j.aborted)
		if err := j.publishOutput(j.aborted, omni.StatusAborted, nil); err != nil {
			r.log.Error().Err(err).Str("session_id", sid).Str("tool_call_id", j.id).Msg("publish aborted tool output failed")
		}
		j.pub.Close()
	}
	if reply == "" {
		return
	}
	nm, err := bus.PackMsg(reply, omni.CancelReply{Runner: r.cfg.RunnerID, ToolCallIDs: ids})
	if err == nil {
		err = r.nc.PublishMsg(nm)
	}
	if err != nil {
		r.log.Warn().Err(err).Str("session_id", sid).Msg("cancel reply failed")
	}
}

// cancelMemory remembers recent cancels, bounded by age and count. Not safe
// for concurrent use (runner.mu guards it).
type cancelMemory struct {
	ttl      time.Duration
	max      int
	calls    map[string]time.Time // jobKey → when cancelled
	sessions map[string]time.Time // session id → when all its jobs were cancelled
	order    []cancelEntry        // oldest first
}

type cancelEntry struct {
	session bool
	key     string
	at      time.Time
}

func newCancelMemory(ttl time.Duration, max int) *cancelMemory {
	return &cancelMemory{ttl: ttl, max: max, calls: map[string]time.Time{}, sessions: map[string]time.Time{}}
}

func (c *cancelMemory) addCall(sid, id string, now time.Time) {
	c.add(cancelEntry{key: jobKey(sid, id), at: now})
}

func (c *cancelMemory) addSession(sid string, now time.Time) {
	c.add(cancelEntry{session: true, key: sid, at: now})
}

func (c *cancelMemory) add(e cancelEntry) {
	c.table(e.session)[e.key] = e.at
	c.order = append(c.order, e)
	c.prune(e.at)
}

func (c *cancelMemory) table(session bool) map[string]time.Time {
	if session {
		return c.sessions
	}
	return c.calls
}

// prune forgets entries older than ttl and the oldest beyond max.
func (c *cancelMemory) prune(now time.Time) {
	n := 0
	for n < len(c.order) && (len(c.order)-n > c.max || now.Sub(c.order[n].at) > c.ttl) {
		e := c.order[n]
		t := c.table(e.session)
		if at, ok := t[e.key]; ok && at.Equal(e.at) {
			delete(t, e.key)
		}
		n++
	}
	if n > 0 {
		c.order = append(c.order[:0], c.order[n:]...)
	}
}

// has reports whether the job (sid, id), stored on the queue at storedAt,
// was cancelled: by id, or by a Session-wide cancel that came after it was
// queued. storedAt is the server's clock and the cancel time this runner's,
// so a Session-wide cancel is as exact as the clocks agree; a zero storedAt
// counts as before every cancel.
func (c *cancelMemory) has(sid, id string, storedAt, now time.Time) bool {
	c.prune(now)
	if _, ok := c.calls[jobKey(sid, id)]; ok {
		return true
	}
	at, ok := c.sessions[sid]
	return ok && !storedAt.After(at)
}
