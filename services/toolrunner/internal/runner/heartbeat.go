package runner

import (
	"slices"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// heartbeatLoop reports every Session's running jobs each
// HeartbeatInterval until stop is closed. Heartbeats are core NATS: a lost
// one is covered by the next.
func (r *runner) heartbeatLoop(stop <-chan struct{}) {
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			r.beatAll()
		}
	}
}

// beatAll publishes one heartbeat per Session with running jobs (or
// jobs whose ack is being confirmed).
func (r *runner) beatAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	bySession := map[string][]string{}
	for _, j := range r.active {
		bySession[j.sid] = append(bySession[j.sid], j.id)
	}
	for _, h := range r.holding {
		bySession[h.sid] = append(bySession[h.sid], h.id)
	}
	for sid, ids := range bySession {
		r.publishBeatLocked(sid, ids)
	}
}

// beat publishes the heartbeat of one Session at once (a job just started).
func (r *runner) beat(sid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for _, j := range r.active {
		if j.sid == sid {
			ids = append(ids, j.id)
		}
	}
	if len(ids) > 0 {
		r.publishBeatLocked(sid, ids)
	}
}

// publishBeatLocked publishes a heartbeat. r.mu must be held: a cancel
// reply then never overtakes a heartbeat that still names a stopped job.
func (r *runner) publishBeatLocked(sid string, ids []string) {
	slices.Sort(ids)
	nm, err := bus.PackMsg(omni.HeartbeatSubject(sid), omni.Heartbeat{Runner: r.cfg.RunnerID, ToolCallIDs: ids})
	if err == nil {
		err = r.nc.PublishMsg(nm)
	}
	if err != nil {
		r.log.Warn().Err(err).Str("session_id", sid).Msg("publish heartbeat failed")
	}
}
