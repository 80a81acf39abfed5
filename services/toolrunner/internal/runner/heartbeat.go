package runner

import (
	"slices"
	"strings"
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
	bySession := map[string][]beat{}
	for _, j := range r.active {
		bySession[j.sid] = append(bySession[j.sid], beat{j.id, j.token})
	}
	for _, h := range r.holding {
		bySession[h.sid] = append(bySession[h.sid], beat{h.id, h.token})
	}
	for sid, jobs := range bySession {
		r.publishBeatLocked(sid, jobs)
	}
}

// beat is one job in a heartbeat: its call and its BeatToken.
type beat struct{ id, token string }

// beat publishes the heartbeat of one Session at once (a job just started).
func (r *runner) beat(sid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var jobs []beat
	for _, j := range r.active {
		if j.sid == sid {
			jobs = append(jobs, beat{j.id, j.token})
		}
	}
	if len(jobs) > 0 {
		r.publishBeatLocked(sid, jobs)
	}
}

// publishBeatLocked publishes a heartbeat: each job with its BeatToken,
// the engine's proof that this runner holds it. r.mu must be held: a
// cancel reply then never overtakes a heartbeat that still names a
// stopped job.
func (r *runner) publishBeatLocked(sid string, jobs []beat) {
	slices.SortFunc(jobs, func(a, b beat) int { return strings.Compare(a.id, b.id) })
	hb := omni.Heartbeat{Runner: r.cfg.RunnerID, ToolCallIDs: make([]string, len(jobs)), Tokens: make([]string, len(jobs))}
	for i, j := range jobs {
		hb.ToolCallIDs[i], hb.Tokens[i] = j.id, j.token
	}
	nm, err := bus.PackMsg(omni.HeartbeatSubject(sid), hb)
	if err == nil {
		err = r.nc.PublishMsg(nm)
	}
	if err != nil {
		r.log.Warn().Err(err).Str("session_id", sid).Msg("publish heartbeat failed")
	}
}
