package task

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
)

// callState tracks one tool call of the running Task.
type callState struct {
	id         string
	name       string
	approved   bool // a job was enqueued (or a subagent started)
	jobSeq     uint64
	started    bool
	lastBeat   time.Time
	dispatched time.Time // when the job was enqueued, then when its wait was last decided
	taken      bool      // the job was seen gone from the queue with no heartbeat yet
	// token is the job's BeatToken: a heartbeat counts only with it. ""
	// for a call resumed from a delivery that knew no BeatKey (records
	// before BeatKey, Runners without a lease): its first token is taken.
	token  string
	output *omni.Message
	// gen is the Task stream's generation (publish.Publisher.Token)
	// before the call's message was queued, from the first sequence of its
	// attempt: its decision must not outlive a loss of the call.
	gen  uint64
	from uint64
}

// calls are the tool calls of the Task's turns: their dispatch as tool
// jobs, their heartbeats, and their outputs read back from the stream
// (whoever published them) or written by the engine when a runner is lost
// or a job cannot be enqueued. A turn's calls are paired with outputs in
// call order: await returns once each has its complete output.
//
// Concurrency: the agent loop adds calls and awaits them; the approval
// loop dispatches them; the heartbeat inbox's goroutine and the outputs
// consumer's callback (a bus.Tail goroutine) update them; abort stops
// them. mu guards m and every callState in it, and is held only for reads
// and updates, never across a publish or a request. changed (1-buffered)
// wakes await when a call changed state; nobody blocks sending on it.
type calls struct {
	d     *Deps
	log   zerolog.Logger
	sid   string
	hist  *history
	prod  *producers
	abort *abortScope
	hb    *inbox

	// key is the Session's BeatKey (nil: none, tokens are random) and
	// legacy says the calls resumed were dispatched without it; both set
	// by setBeatKey before any other goroutine of the Task starts.
	key    []byte
	legacy bool

	mu      sync.Mutex
	m       map[string]*callState
	changed chan struct{}
}

// setBeatKey sets the Session's BeatKey; created: this delivery created
// it, so the jobs of earlier deliveries carry tokens of no key.
func (c *calls) setBeatKey(key string, created bool) {
	if key != "" {
		c.key, c.legacy = []byte(key), created
	}
}

// beatToken is the BeatToken of call id's job: an HMAC of the Session
// and call under the BeatKey, so an engine resuming the call knows it; a
// random one without a key.
func (c *calls) beatToken(id string) string {
	if c.key == nil {
		return randomHex(16)
	}
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(c.sid + "/" + id))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

func newCalls(d *Deps, log zerolog.Logger, sid string, hist *history, prod *producers, abort *abortScope) *calls {
	return &calls{d: d, log: log, sid: sid, hist: hist, prod: prod, abort: abort,
		m: make(map[string]*callState), changed: make(chan struct{}, 1)}
}

// signal wakes await.
func (c *calls) signal() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// add records a call whose complete message the Task queued, gen and from
// being the stream's generation and the attempt's first sequence then.
func (c *calls) add(id, name string, gen, from uint64) {
	c.mu.Lock()
	c.m[id] = &callState{id: id, name: name, gen: gen, from: from}
	c.mu.Unlock()
}

// resume records the committed calls of an earlier engine still without
// output as started (their runners may be working on them), each with
// its job's BeatToken, and returns every call known.
func (c *calls) resume(unpaired []string) []string {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range unpaired {
		cs := &callState{id: id, approved: true, started: true, lastBeat: now, dispatched: now}
		if c.key != nil && !c.legacy {
			cs.token = c.beatToken(id)
		}
		c.m[id] = cs
	}
	ids := make([]string, 0, len(c.m))
	for id := range c.m {
		ids = append(ids, id)
	}
	return ids
}

// lineage returns the generation and attempt start a call was queued at;
// ok is false when the call is not (or no longer) known.
func (c *calls) lineage(id string) (gen, from uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cs := c.m[id]
	if cs == nil {
		return 0, 0, false
	}
	return cs.gen, cs.from, true
}

// known reports whether the call is still tracked (not dropped with a
// failed attempt).
func (c *calls) known(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id] != nil
}

// drop forgets a call whose message the stream lost: nothing waits for it.
func (c *calls) drop(id string) {
	c.mu.Lock()
	delete(c.m, id)
	c.mu.Unlock()
	c.signal()
}

// keepStored returns the calls of ids the stream holds (stored) and
// forgets the others: they never ran and are not awaited.
func (c *calls) keepStored(ids []string, stored map[string]bool) []string {
	kept := ids[:0]
	c.mu.Lock()
	for _, id := range ids {
		if stored[id] {
			kept = append(kept, id)
		} else {
			delete(c.m, id)
		}
	}
	c.mu.Unlock()
	return kept
}

// dispatched records that a call's job was enqueued at jobSeq of
// FLOE_TOOLS (0 for a subagent, which runs in the engine).
func (c *calls) dispatched(id string, jobSeq uint64) {
	c.mu.Lock()
	if cs := c.m[id]; cs != nil {
		cs.approved, cs.jobSeq, cs.dispatched = true, jobSeq, time.Now()
	}
	c.mu.Unlock()
}

// openHeartbeats starts serving the runners' heartbeats for the Session's
// calls; closeHeartbeats stops it.
func (c *calls) openHeartbeats() error {
	in, err := openInbox(c.d.NC, omni.HeartbeatSubject(c.sid), 256, c.onHeartbeat)
	if err != nil {
		return err
	}
	c.hb = in
	return nil
}

func (c *calls) closeHeartbeats() {
	if c.hb != nil {
		c.hb.close()
	}
}

// onHeartbeat counts a runner's report of the calls it runs, each only
// with its job's BeatToken: a runner may keep alive only the jobs it
// holds (it pulled them), not any call of any Session. A call resumed
// from an earlier engine requires the token derived from the BeatKey
// (a forged first heartbeat cannot claim it); only a call dispatched
// before the Session had a key takes the first token reported for it.
func (c *calls) onHeartbeat(m *nats.Msg) {
	var hb omni.Heartbeat
	if err := omni.Unpack(m.Data, &hb); err != nil {
		c.log.Warn().Err(err).Msg("bad heartbeat")
		return
	}
	now := time.Now()
	var forged []string
	c.mu.Lock()
	for i, id := range hb.ToolCallIDs {
		cs := c.m[id]
		if cs == nil {
			continue
		}
		token := ""
		if i < len(hb.Tokens) {
			token = hb.Tokens[i]
		}
		switch {
		case token == "":
			forged = append(forged, id)
			continue
		case cs.token == "" && cs.jobSeq == 0 && cs.started:
			cs.token = token // resumed: the runner's job is the one it holds
		case token != cs.token:
			forged = append(forged, id)
			continue
		}
		cs.started, cs.lastBeat = true, now
	}
	c.mu.Unlock()
	if len(forged) > 0 {
		c.log.Warn().Str("runner", hb.Runner).Strs("tool_call_ids", forged).Msg("heartbeat without its job's token ignored")
	}
}

// setToken records the BeatToken of a call's job before it is enqueued.
func (c *calls) setToken(id, token string) {
	c.mu.Lock()
	if cs := c.m[id]; cs != nil {
		cs.token = token
	}
	c.mu.Unlock()
}

// record folds a complete tool_call_output the stream holds and hands it
// to the call waiting for it. The fold has it before the call does, so a
// request that follows await sees it in its context.
func (c *calls) record(m *omni.Message) {
	c.hist.apply(m)
	c.mu.Lock()
	if cs := c.m[m.Payload.ToolCallID]; cs != nil && cs.output == nil {
		cs.output = m
	}
	c.mu.Unlock()
	c.signal()
}

// follow reads the Session's model subject from startSeq and records every
// complete tool_call_output, whoever published it, until stop is called.
func (c *calls) follow(ctx context.Context, startSeq uint64) (stop func(), err error) {
	// A Tail, not nats.go's ordered consumer: that one could stay silent
	// for the rest of the Task when the server its consumer lived on was
	// killed, and every later call waited out the heartbeat timeout
	// (bus.Tail says why).
	tail, err := bus.StartTail(ctx, c.d.JS, omni.SessionsStream, []string{omni.SessionSubject(c.sid, omni.ClassModel)}, startSeq,
		bus.TailOptions{OnError: func(err error, replacing bool) {
			if !c.abort.aborted() {
				c.log.Warn().Err(err).Bool("replacing", replacing).Msg("outputs consumer")
			}
		}},
		func(msg jetstream.Msg) {
			m, err := omni.Decode(msg.Data())
			if err != nil {
				c.log.Warn().Err(err).Str("subject", msg.Subject()).Msg("undecodable message on model subject skipped")
				return
			}
			if m.Payload.Type != omni.TypeToolCallOutput {
				return
			}
			c.record(&m)
		})
	if err != nil {
		return nil, fmt.Errorf("follow outputs: %w", err)
	}
	return tail.Stop, nil
}

// await waits until every call in ids has its complete output. A started
// job whose heartbeats stop is declared lost with a failed output (its
// side effects may have happened, so it is never re-run).
func (c *calls) await(actx context.Context, ids []string) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	timeout := c.d.Settings.HeartbeatTimeout
	for {
		var lost []*callState
		var unstarted []*callState
		done := true
		now := time.Now()
		c.mu.Lock()
		for _, id := range ids {
			cs := c.m[id]
			if cs == nil || cs.output != nil {
				continue
			}
			done = false
			if cs.started && now.Sub(cs.lastBeat) > timeout {
				lost = append(lost, cs)
				cs.lastBeat = now // publish once per timeout window
			}
			if !cs.started && cs.jobSeq > 0 && now.Sub(cs.dispatched) > timeout {
				unstarted = append(unstarted, cs)
				cs.dispatched = now // once per timeout window
			}
		}
		c.mu.Unlock()
		if done {
			return nil
		}
		for _, cs := range unstarted {
			c.notStarted(actx, cs, timeout)
		}
		for _, cs := range lost {
			id := cs.id
			c.log.Warn().Str("tool_call_id", id).Msg("tool runner lost; call failed with unknown outcome")
			c.withdraw(actx, cs.jobSeq)
			out := omni.ToolCallOutput(id, fmt.Sprintf(
				"[tool runner lost: no heartbeat for %s; the outcome is unknown and the call was not re-run]",
				timeout), omni.StatusFailed)
			c.publishLost(actx, &out)
		}
		select {
		case <-c.changed:
		case <-tick.C:
		case <-actx.Done():
			return errAborted
		}
	}
}

// notStarted decides about a call whose job no runner has reported
// running (no heartbeat) for timeout since it was enqueued or last
// decided about. How long the queue is, is no reason to fail it: a
// saturated pool works through its queue. So a job still in the queue
// waits as long as a live runner of the pool answers (the pool's tool
// list subject, which every runner serves whatever its load); when none
// does, it is withdrawn, so it never runs later, and the call gets a
// failed "not started" output. A job gone from the queue was taken by a
// runner, which reports a job the moment it starts it (and while it is
// still confirming its ack): one more timeout without a heartbeat and
// the call fails with an unknown outcome (the runner's ack may have been
// applied though it saw it fail). The runner's own output, if it comes
// first, wins (the same Msg-Id).
func (c *calls) notStarted(actx context.Context, cs *callState, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(actx, 5*time.Second)
	defer cancel()
	s, err := c.d.JS.Stream(ctx, omni.ToolsStream)
	if err != nil {
		return // the bus is unavailable: next round
	}
	var text string
	_, err = s.GetMsg(ctx, cs.jobSeq)
	switch {
	case err == nil:
		if alive, why := c.runnerAlive(ctx); alive {
			c.log.Debug().Str("tool_call_id", cs.id).Str("runners", why).Msg("tool job still queued behind busy runners; waiting")
			return
		}
		if err := s.DeleteMsg(ctx, cs.jobSeq); err != nil {
			if !jobGone(err) {
				c.log.Warn().Err(err).Uint64("job_seq", cs.jobSeq).Msg("cannot withdraw a tool job not started; asking again")
			}
			return // or taken meanwhile: its runner reports it, or the next round decides
		}
		text = fmt.Sprintf("[tool not started: no live tool runner of pool %q took the job within %s; it was withdrawn and not run]", c.pool(), timeout)
	case errors.Is(err, jetstream.ErrMsgNotFound):
		c.mu.Lock()
		first := !cs.taken
		cs.taken = true
		c.mu.Unlock()
		if first {
			return // taken: one more round for its runner's first heartbeat
		}
		text = fmt.Sprintf("[tool not started: a tool runner took the job but did not report it running within %s; the outcome is unknown and the call was not re-run]", timeout)
	default:
		return // cannot tell: next round
	}
	c.mu.Lock()
	started := cs.started || cs.output != nil
	c.mu.Unlock()
	if started {
		return // it started after all (a heartbeat came meanwhile)
	}
	c.log.Warn().Str("tool_call_id", cs.id).Uint64("job_seq", cs.jobSeq).Msg("tool job not started; call failed")
	out := omni.ToolCallOutput(cs.id, text, omni.StatusFailed)
	c.publishLost(actx, &out)
}

// runnerAlive asks the pool's runners for their MCP server names (a
// request that connects nothing, served apart from the jobs): any answer,
// or a request that times out because a runner is slow to answer, says a
// runner of the pool is there; only "no responders" says none is.
func (c *calls) runnerAlive(ctx context.Context) (bool, string) {
	body, err := omni.Pack(&omni.ToolListRequest{ServersOnly: true})
	if err != nil {
		return true, "cannot ask"
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	reply, err := c.d.NC.RequestWithContext(rctx, omni.ToolListSubject(c.pool()), body)
	switch {
	case err == nil:
		var list omni.ToolList
		_ = omni.Unpack(reply.Data, &list)
		return true, "runner " + list.Runner + " answered"
	case errors.Is(err, nats.ErrNoResponders):
		return false, "none"
	default:
		return true, "no answer yet: " + err.Error()
	}
}

// withdraw deletes a job from the queue if it is still there (best
// effort): a call declared lost must not run later, on a redelivery.
func (c *calls) withdraw(actx context.Context, jobSeq uint64) {
	if jobSeq == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(actx, 5*time.Second)
	defer cancel()
	if s, err := c.d.JS.Stream(ctx, omni.ToolsStream); err == nil {
		if err := s.DeleteMsg(ctx, jobSeq); err != nil && !jobGone(err) {
			c.log.Warn().Err(err).Uint64("job_seq", jobSeq).Msg("could not withdraw a lost call's job")
		}
	}
}

// jobGone reports whether deleting a job failed because it is no longer
// in the queue (a runner's ack removed it): "no message found".
// nats.go keeps only the text of the server's error (err_code 10057,
// JSStreamMsgDeleteFailedF) in ErrMsgDeleteUnsuccessful: its code is read
// from there.
func jobGone(err error) bool {
	var ae *jetstream.APIError
	return errors.Is(err, jetstream.ErrMsgNotFound) || (errors.As(err, &ae) && ae.ErrorCode == 10057) ||
		(errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) && strings.Contains(err.Error(), "err_code=10057"))
}

// publishLost publishes the failed output of a call whose runner is lost.
// The output's Msg-Id collapses it with the runner's own when that got
// there first: the stream then answers with the stored one's sequence,
// which is read and recorded, so the call ends even when the outputs
// consumer missed it (one lost with its server, not yet replaced).
func (c *calls) publishLost(actx context.Context, out *omni.Message) {
	id := out.Payload.ToolCallID
	ack, err := c.prod.publishOutput(actx, out)
	if err != nil {
		if !c.abort.aborted() {
			c.log.Error().Err(err).Msg("could not publish lost-runner output")
		}
		return
	}
	if !ack.Duplicate {
		c.record(out)
		return
	}
	ctx, cancel := context.WithTimeout(actx, 10*time.Second)
	defer cancel()
	stream, err := c.d.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return
	}
	sm, err := stream.GetMsg(ctx, ack.Seq)
	if err != nil {
		c.log.Warn().Err(err).Str("tool_call_id", id).Msg("could not read the stored output")
		return
	}
	if m, err := omni.Decode(sm.Data); err == nil && m.Payload.Type == omni.TypeToolCallOutput && m.Payload.ToolCallID == id {
		c.record(&m)
	}
}

// outputsOf returns the outputs recorded for ids.
func (c *calls) outputsOf(ids []string) map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]string, len(ids))
	for _, id := range ids {
		if cs := c.m[id]; cs != nil && cs.output != nil {
			out[id] = cs.output.Payload.Output
		}
	}
	return out
}

// pool is the runner pool the Task's jobs go to.
func (c *calls) pool() string {
	if c.d.Settings.Pool != "" {
		return c.d.Settings.Pool
	}
	return omni.DefaultPool
}

// dispatch enqueues the job of an allowed call. A job that can never be
// enqueued gets a failed output, so nothing waits for it.
func (c *calls) dispatch(actx context.Context, tc omni.Message, workspace string) error {
	id := tc.Payload.ToolCallID
	job := omni.ToolJob{
		SessionID:      c.sid,
		ToolCallID:     id,
		Name:           tc.Payload.Name,
		Arguments:      tc.Payload.Arguments,
		Workspace:      workspace,
		EnqueuedUnixMs: time.Now().UnixMilli(),
		BeatToken:      c.beatToken(id),
	}
	c.setToken(id, job.BeatToken) // before a runner can beat for it
	nm, err := bus.PackMsg(omni.ToolSubject(c.pool(), c.sid), &job)
	if err != nil {
		return err
	}
	nm.Header.Set(jetstream.MsgIDHeader, c.sid+"/"+id+"/job")
	telemetry.Inject(actx, nm.Header) // the runner's execute_tool span is the Task's child
	ack, err := c.enqueue(actx, nm)
	if err != nil {
		// The call can never run: pair it with a failed output.
		out := omni.ToolCallOutput(id, fmt.Sprintf("[tool not dispatched: %v]", err), omni.StatusFailed)
		_ = c.prod.publishSync(context.WithoutCancel(actx), &out, bus.OutputMsgID(c.sid, id))
		return fmt.Errorf("enqueue tool job: %w", err)
	}
	c.dispatched(id, ack.Sequence)
	return nil
}

// enqueue publishes a tool job, retrying for up to a minute while the
// stream does not answer (a leader election): the job's Msg-Id makes a
// retry of a job already stored a duplicate, so it is queued once, and a
// call is declared not dispatched only when the stream refused it or
// stayed silent that long.
func (c *calls) enqueue(actx context.Context, nm *nats.Msg) (*jetstream.PubAck, error) {
	return retry.Do(actx, retry.Exponential(100*time.Millisecond, 2*time.Second), time.Minute, func() (*jetstream.PubAck, error) {
		ack, err := c.d.JS.PublishMsg(actx, nm)
		var apiErr *jetstream.APIError
		refused := errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500 && apiErr.Code != 408 && apiErr.Code != 429
		if refused || (err != nil && actx.Err() != nil) {
			return ack, retry.Permanent(err)
		}
		return ack, err
	}, func(err error, _ time.Duration) {
		c.log.Warn().Err(err).Str("subject", nm.Subject).Msg("tool job not acknowledged; retrying")
	})
}

// undispatched pairs a call on the stream whose job will never be
// enqueued (its decision could not be stored within a minute) with a
// failed output, so nothing waits for it forever.
func (c *calls) undispatched(actx context.Context, id, reason string) {
	ctx := context.WithoutCancel(actx)
	out := omni.ToolCallOutput(id, "[tool not dispatched: "+reason+"]", omni.StatusFailed)
	if err := c.prod.publishSync(ctx, &out, bus.OutputMsgID(c.sid, id)); err != nil {
		c.log.Error().Err(err).Str("tool_call_id", id).Msg("could not pair an undispatched call")
	}
}

// stop stops the Task's outstanding jobs after a user abort: jobs still
// queued are deleted from the work queue; running ones are cancelled and
// the runners confirm (within CancelWait) that they will publish nothing
// more, each having published its aborted output first.
func (c *calls) stop(ctx context.Context) {
	c.mu.Lock()
	var queued []*callState
	var running []string
	for _, cs := range c.m {
		if !cs.approved || cs.output != nil {
			continue
		}
		if cs.started {
			running = append(running, cs.id)
		} else {
			queued = append(queued, cs)
		}
	}
	c.mu.Unlock()
	if len(queued) > 0 {
		if s, err := c.d.JS.Stream(ctx, omni.ToolsStream); err == nil {
			for _, cs := range queued {
				if err := s.DeleteMsg(ctx, cs.jobSeq); err != nil {
					running = append(running, cs.id) // a runner took it meanwhile
				}
			}
		}
	}
	if len(running) > 0 {
		c.cancelRunning(ctx, running)
	}
}

func (c *calls) cancelRunning(ctx context.Context, ids []string) {
	inbox := c.d.NC.NewRespInbox()
	replies := make(chan *nats.Msg, 64)
	sub, err := c.d.NC.ChanSubscribe(inbox, replies)
	if err != nil {
		c.log.Error().Err(err).Msg("cancel subscription failed")
		return
	}
	defer sub.Unsubscribe()
	body, _ := omni.Pack(&omni.Cancel{ToolCallIDs: ids})
	if err := c.d.NC.PublishRequest(omni.CancelSubject(c.sid), inbox, body); err != nil {
		c.log.Error().Err(err).Msg("cancel publish failed")
		return
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	timeout := time.NewTimer(c.d.Settings.CancelWait)
	defer timeout.Stop()
	for len(want) > 0 {
		select {
		case m := <-replies:
			var rep omni.CancelReply
			if omni.Unpack(m.Data, &rep) == nil {
				for _, id := range rep.ToolCallIDs {
					delete(want, id)
				}
			}
		case <-timeout.C:
			c.log.Warn().Int("unconfirmed", len(want)).Msg("runners did not confirm cancellation in time")
			return
		case <-ctx.Done():
			return
		}
	}
}
