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
	"floe.dev/pkg/omni/cmdpolicy"
)

// approveLoop decides the calls of one request one at a time, in call
// order, while the LLM stream goes on.
func (r *Runner) approveLoop(ctx, actx context.Context, queue <-chan omni.Message, done chan<- struct{}) {
	defer close(done)
	for tc := range queue {
		if r.aborted() {
			continue
		}
		if err := r.approveOne(ctx, actx, tc); err != nil && !r.aborted() {
			r.log.Error().Err(err).Str("tool_call_id", tc.Payload.ToolCallID).Msg("approval failed")
		}
	}
}

// approveOne decides one call and enqueues its job (or runs its
// subagent). ctx is the lease scope, actx the abort scope: everything but
// a subagent's forwarding ends with actx.
func (r *Runner) approveOne(ctx, actx context.Context, tc omni.Message) error {
	id := tc.Payload.ToolCallID
	decision, err := r.decide(actx, tc)
	if errors.Is(err, errCallLost) {
		return nil // gone with its failed attempt: nothing to ask
	}
	if err != nil {
		return err
	}
	ad := omni.ApprovalDecision(decision, id)
	// Stored before the job exists: no output of this call can precede it.
	if err := r.publishDecision(actx, &ad, id); err != nil {
		if errors.Is(err, errCallLost) {
			return nil // gone with its failed attempt: nothing to decide
		}
		if !r.aborted() {
			r.undispatched(actx, id, "its approval decision was not stored: "+err.Error())
		}
		return err
	}
	if decision != omni.DecisionAllow {
		text := omni.DeniedByUser
		if decision == omni.DecisionForbidden {
			text = omni.DeniedByPolicy
		}
		out := omni.ToolCallOutput(id, text, omni.StatusAborted)
		return r.publishSync(actx, &out, bus.OutputMsgID(r.sid, id))
	}
	if tc.Payload.Name == SubagentTool {
		r.mu.Lock()
		if cs := r.calls[id]; cs != nil {
			cs.approved, cs.dispatched = true, time.Now()
		}
		r.mu.Unlock()
		r.workers.Add(1)
		go func() {
			defer r.workers.Done()
			r.runSubagent(ctx, actx, tc)
		}()
		return nil
	}
	job := omni.ToolJob{
		SessionID:      r.sid,
		ToolCallID:     id,
		Name:           tc.Payload.Name,
		Arguments:      tc.Payload.Arguments,
		Workspace:      r.rec.Workspace,
		EnqueuedUnixMs: time.Now().UnixMilli(),
	}
	nm, err := bus.PackMsg(omni.ToolSubject(r.pool(), r.sid), &job)
	if err != nil {
		return err
	}
	nm.Header.Set(jetstream.MsgIDHeader, r.sid+"/"+id+"/job")
	ack, err := r.enqueueJob(actx, nm)
	if err != nil {
		// The call can never run: pair it with a failed output.
		out := omni.ToolCallOutput(id, fmt.Sprintf("[tool not dispatched: %v]", err), omni.StatusFailed)
		_ = r.publishSync(context.WithoutCancel(actx), &out, bus.OutputMsgID(r.sid, id))
		return fmt.Errorf("enqueue tool job: %w", err)
	}
	r.mu.Lock()
	if cs := r.calls[id]; cs != nil {
		cs.approved, cs.jobSeq, cs.dispatched = true, ack.Sequence, time.Now()
	}
	r.mu.Unlock()
	return nil
}

// errCallLost: the stream lost a call's own message (its attempt failed).
var errCallLost = errors.New("the tool call's message was not stored")

// publishDecision publishes a call's approval decision on the Task's
// stream only if the call's message is stored: when a message the Task
// published since the call was queued is lost (publish.ErrStale, or the
// decision's own failure), it waits until the request's recovery resumed
// the stream and reads the attempt back; a call that is on the stream gets
// its decision then, a call that is not is dropped (errCallLost) and
// nothing waits for it.
func (r *Runner) publishDecision(ctx context.Context, ad *omni.Message, id string) error {
	r.mu.Lock()
	cs := r.calls[id]
	var gen, from uint64
	if cs != nil {
		gen, from = cs.gen, cs.from
	}
	r.mu.Unlock()
	if cs == nil {
		return errCallLost
	}
	deadline := time.Now().Add(time.Minute)
	for {
		nm, err := bus.SessionMsg(r.sid, ad, "")
		if err != nil {
			return err
		}
		if !r.leaseValid() {
			return ErrLeaseLost
		}
		_, err = r.pub.SyncAfter(ctx, nm, gen)
		if err == nil {
			r.apply(ad)
			return nil
		}
		if errors.Is(err, publish.ErrFenced) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		r.log.Warn().Err(err).Str("tool_call_id", id).Msg("approval decision not stored; reading the call back")
		for r.pub.Failed() && ctx.Err() == nil && time.Now().Before(deadline) {
			if !r.inAttempt.Load() {
				// No request is streaming: the loss is not one a
				// request's recovery will handle.
				r.pub.Resume()
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		gen = r.pub.Token()
		// Only a successful read decides: during an election the read may
		// fail, and the call must not get a decision unless it is stored.
		var stored map[string]bool
		for {
			var rerr error
			if _, stored, rerr = r.unfinished(ctx, from); rerr == nil {
				break
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				return rerr
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !stored[id] {
			r.mu.Lock()
			delete(r.calls, id)
			r.mu.Unlock()
			select {
			case r.changed <- struct{}{}:
			default:
			}
			return errCallLost
		}
	}
}

// undispatched pairs a call on the stream whose job will never be
// enqueued (its decision could not be stored within a minute) with a
// failed output, so nothing waits for it forever.
func (r *Runner) undispatched(actx context.Context, id, reason string) {
	ctx := context.WithoutCancel(actx)
	out := omni.ToolCallOutput(id, "[tool not dispatched: "+reason+"]", omni.StatusFailed)
	if err := r.publishSync(ctx, &out, bus.OutputMsgID(r.sid, id)); err != nil {
		r.log.Error().Err(err).Str("tool_call_id", id).Msg("could not pair an undispatched call")
	}
}

func (r *Runner) pool() string {
	if r.d.Settings.Pool != "" {
		return r.d.Settings.Pool
	}
	return omni.DefaultPool
}

// decide applies the Session's command policy, then its approval mode,
// read fresh so a PATCH takes effect mid-run; a human decision is awaited
// when the mode asks.
func (r *Runner) decide(actx context.Context, tc omni.Message) (string, error) {
	if r.policyForbids(tc) {
		return omni.DecisionForbidden, nil
	}
	mode := r.rec.ApprovalMode
	if rec, _, err := r.d.Sessions.Get(actx, r.sid); err == nil {
		mode = rec.ApprovalMode
	}
	switch mode {
	case omni.ApproveDenyAll:
		return omni.DecisionDeny, nil
	case omni.ApproveReadOnly:
		if r.toolPerms[tc.Payload.Name] == "r" {
			return omni.DecisionAllow, nil
		}
	case omni.ApproveAlwaysAsk:
	default:
		return omni.DecisionAllow, nil
	}
	return r.ask(actx, tc)
}

// policyForbids matches an exec_command's cmd against the command policy
// snapshotted in the Session record (SPEC §7).
func (r *Runner) policyForbids(tc omni.Message) bool {
	if tc.Payload.Name != execTool {
		return false
	}
	var args struct {
		Cmd string `json:"cmd"`
	}
	if json.Unmarshal([]byte(tc.Payload.Arguments), &args) != nil || args.Cmd == "" {
		return false // the tool itself reports the bad arguments
	}
	m, err := cmdpolicy.Compile(r.rec.CommandPolicy)
	if err != nil {
		// Checked when the policy was loaded; a record that still fails
		// is treated as denying everything it was meant to catch.
		r.log.Error().Err(err).Msg("command policy does not compile; exec_command forbidden")
		return true
	}
	rule, hit := m.Match(args.Cmd)
	if hit {
		r.log.Info().Str("tool_call_id", tc.Payload.ToolCallID).Str("rule", rule.Name).Msg("command policy forbids the call")
	}
	return hit
}

// execTool is the tool the command policy applies to.
const execTool = "exec_command"

// ask publishes an approval_request and waits for the human's decision.
func (r *Runner) ask(actx context.Context, tc omni.Message) (string, error) {
	raw, err := omni.Marshal(&tc)
	if err != nil {
		return "", err
	}
	ev := omni.ServerEvent{Type: omni.ServerApprovalRequest, ToolCall: raw}
	b, _ := json.Marshal(ev)
	a := &approval{event: b, decision: make(chan string, 1)}
	id := tc.Payload.ToolCallID
	// Server events are another producer: the call's own message is
	// stored first, so the request never precedes the call it asks about.
	// After a loss since the call was queued, the attempt's recovery reads
	// back whether the call is on the stream (and drops it from calls when
	// not); one that is not is never asked about (nobody could answer for
	// it, and the attempt waits for its approvals).
	r.mu.Lock()
	var gen uint64
	if cs := r.calls[id]; cs != nil {
		gen = cs.gen
	}
	r.mu.Unlock()
	if _, err := r.pub.Settle(actx); err != nil || r.pub.Token() != gen {
		for r.inAttempt.Load() && actx.Err() == nil {
			select {
			case <-time.After(50 * time.Millisecond):
			case <-actx.Done():
			}
		}
	}
	r.mu.Lock()
	lost := r.calls[id] == nil
	if !lost {
		r.pending[id] = a
	}
	r.mu.Unlock()
	if lost {
		return "", errCallLost
	}
	defer func() {
		r.mu.Lock()
		delete(r.pending, id)
		r.mu.Unlock()
	}()
	if _, err := r.server(actx, ev, ""); err != nil {
		return "", err
	}
	select {
	case d := <-a.decision:
		return d, nil
	case <-actx.Done():
		return "", errAborted
	}
}

// awaitOutputs waits until every call in ids has its complete output. A
// started job whose heartbeats stop is declared lost with a failed output
// (its side effects may have happened, so it is never re-run).
func (r *Runner) awaitOutputs(actx context.Context, ids []string) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		var lost []string
		done := true
		now := time.Now()
		r.mu.Lock()
		for _, id := range ids {
			cs := r.calls[id]
			if cs == nil || cs.output != nil {
				continue
			}
			done = false
			if cs.started && now.Sub(cs.lastBeat) > r.d.Settings.HeartbeatTimeout {
				lost = append(lost, id)
				cs.lastBeat = now // publish once per timeout window
			}
		}
		r.mu.Unlock()
		if done {
			return nil
		}
		for _, id := range lost {
			r.log.Warn().Str("tool_call_id", id).Msg("tool runner lost; call failed with unknown outcome")
			out := omni.ToolCallOutput(id, fmt.Sprintf(
				"[tool runner lost: no heartbeat for %s; the outcome is unknown and the call was not re-run]",
				r.d.Settings.HeartbeatTimeout), omni.StatusFailed)
			r.publishLostOutput(actx, &out)
		}
		select {
		case <-r.changed:
		case <-tick.C:
		case <-actx.Done():
			return errAborted
		}
	}
}

func (r *Runner) onHeartbeat(m *nats.Msg) {
	var hb omni.Heartbeat
	if err := omni.Unpack(m.Data, &hb); err != nil {
		r.log.Warn().Err(err).Msg("bad heartbeat")
		return
	}
	now := time.Now()
	r.mu.Lock()
	for _, id := range hb.ToolCallIDs {
		if cs := r.calls[id]; cs != nil {
			cs.started, cs.lastBeat = true, now
		}
	}
	r.mu.Unlock()
}

// followOutputs reads the Session's model subject from startSeq and records
// every complete tool_call_output, whoever published it.
// recordOutput folds a complete tool_call_output the stream holds and
// hands it to the call waiting for it.
func (r *Runner) recordOutput(m *omni.Message) {
	r.mu.Lock()
	r.fc.Apply(m)
	cs := r.calls[m.Payload.ToolCallID]
	if cs != nil && cs.output == nil {
		cs.output = m
	}
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// publishLostOutput publishes the failed output of a call whose runner is
// lost. The output's Msg-Id collapses it with the runner's own when that
// got there first: the stream then answers with the stored one's sequence,
// which is read and recorded, so the call ends even when the outputs
// consumer missed it (one lost with its server, not yet replaced).
func (r *Runner) publishLostOutput(actx context.Context, out *omni.Message) {
	id := out.Payload.ToolCallID
	nm, err := bus.SessionMsg(r.sid, out, bus.OutputMsgID(r.sid, id))
	if err != nil {
		return
	}
	ack, err := r.out.Sync(actx, nm)
	if err != nil {
		if !r.aborted() {
			r.log.Error().Err(err).Msg("could not publish lost-runner output")
		}
		return
	}
	if !ack.Duplicate {
		r.recordOutput(out)
		return
	}
	ctx, cancel := context.WithTimeout(actx, 10*time.Second)
	defer cancel()
	stream, err := r.d.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return
	}
	sm, err := stream.GetMsg(ctx, ack.Seq)
	if err != nil {
		r.log.Warn().Err(err).Str("tool_call_id", id).Msg("could not read the stored output")
		return
	}
	if m, err := omni.Decode(sm.Data); err == nil && m.Payload.Type == omni.TypeToolCallOutput && m.Payload.ToolCallID == id {
		r.recordOutput(&m)
	}
}

// enqueueJob publishes a tool job, retrying for up to a minute while the
// stream does not answer (a leader election): the job's Msg-Id makes a
// retry of a job already stored a duplicate, so it is queued once, and a
// call is declared not dispatched only when the stream refused it or
// stayed silent that long.
func (r *Runner) enqueueJob(actx context.Context, nm *nats.Msg) (*jetstream.PubAck, error) {
	deadline := time.Now().Add(time.Minute)
	wait := 100 * time.Millisecond
	for {
		ack, err := r.d.JS.PublishMsg(actx, nm)
		var apiErr *jetstream.APIError
		refused := errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500 && apiErr.Code != 408 && apiErr.Code != 429
		if err == nil || refused || actx.Err() != nil || time.Now().After(deadline) {
			return ack, err
		}
		r.log.Warn().Err(err).Str("subject", nm.Subject).Msg("tool job not acknowledged; retrying")
		select {
		case <-time.After(wait):
		case <-actx.Done():
			return nil, actx.Err()
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func (r *Runner) followOutputs(ctx context.Context, startSeq uint64) (stop func(), err error) {
	// A Tail, not nats.go's ordered consumer: that one could stay silent
	// for the rest of the Task when the server its consumer lived on was
	// killed, and every later call waited out the heartbeat timeout
	// (bus.Tail says why).
	tail, err := bus.StartTail(ctx, r.d.JS, omni.SessionsStream, []string{omni.SessionSubject(r.sid, omni.ClassModel)}, startSeq,
		bus.TailOptions{OnError: func(err error, replacing bool) {
			if !r.aborted() {
				r.log.Warn().Err(err).Bool("replacing", replacing).Msg("outputs consumer")
			}
		}},
		func(msg jetstream.Msg) {
			m, err := omni.Decode(msg.Data())
			if err != nil {
				r.log.Warn().Err(err).Str("subject", msg.Subject()).Msg("undecodable message on model subject skipped")
				return
			}
			if m.Payload.Type != omni.TypeToolCallOutput {
				return
			}
			r.recordOutput(&m)
		})
	if err != nil {
		return nil, fmt.Errorf("follow outputs: %w", err)
	}
	return tail.Stop, nil
}

// onControl serves floe.ctl.<sid>.<verb> for the Task's lifetime.
func (r *Runner) onControl(m *nats.Msg) {
	var c omni.Control
	if len(m.Data) > 0 {
		if err := omni.Unpack(m.Data, &c); err != nil {
			r.reply(m, omni.ControlReply{Code: omni.CodeBadRequest, Message: err.Error()})
			return
		}
	}
	verb := m.Subject[len(omni.ControlSubject(r.sid, "")):]
	switch verb {
	case omni.CtlApprove:
		if c.Decision != omni.DecisionAllow && c.Decision != omni.DecisionDeny {
			r.reply(m, omni.ControlReply{Code: omni.CodeBadRequest, Message: "decision must be allow or deny"})
			return
		}
		r.mu.Lock()
		a := r.pending[c.ToolCallID]
		if a != nil {
			delete(r.pending, c.ToolCallID)
		}
		r.mu.Unlock()
		if a == nil {
			if rep, ok := r.forwardApproval(c); ok {
				r.reply(m, rep)
				return
			}
			r.reply(m, omni.ControlReply{Code: omni.CodeNotFound, Message: "no pending approval for " + c.ToolCallID})
			return
		}
		a.decision <- c.Decision
		r.reply(m, omni.ControlReply{OK: true})
	case omni.CtlAbort:
		r.abortByUser()
		r.reply(m, omni.ControlReply{OK: true})
	case omni.CtlSteer:
		r.mu.Lock()
		closed := r.steerClosed
		if !closed {
			r.steering = append(r.steering, c.Text)
		}
		r.mu.Unlock()
		if closed {
			r.reply(m, omni.ControlReply{Code: omni.CodeNotRunning, Message: "the run is ending; steering was not taken"})
			return
		}
		r.reply(m, omni.ControlReply{OK: true})
	case omni.CtlRetryNow:
		r.reply(m, omni.ControlReply{OK: true, Skipped: r.retryNow()})
	case omni.CtlPending:
		r.mu.Lock()
		var p [][]byte
		for _, a := range r.pending {
			p = append(p, a.event)
		}
		for _, ca := range r.childApprovals {
			p = append(p, ca.event)
		}
		r.mu.Unlock()
		r.reply(m, omni.ControlReply{OK: true, Pending: p})
	default:
		r.reply(m, omni.ControlReply{Code: omni.CodeBadRequest, Message: "unknown control verb " + verb})
	}
}

func (r *Runner) reply(m *nats.Msg, rep omni.ControlReply) {
	if m.Reply == "" {
		return
	}
	b, err := omni.Pack(&rep)
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		r.log.Warn().Err(err).Msg("control reply failed")
	}
}

// finishAbort stops the Task's outstanding tool jobs and publishes abort as
// the run's last message (case A: each stopped tool's runner has published
// its aborted output, [interrupted: tool aborted by user], before it
// confirms, so those outputs precede abort; calls never dispatched get the
// placeholder in the next request only). Jobs still queued are deleted from the work
// queue; running ones are cancelled and the runners confirm they will
// publish nothing more, so nothing of this run lands after abort.
func (r *Runner) finishAbort(ctx context.Context) {
	r.mu.Lock()
	var queued []*callState
	var running []string
	for _, cs := range r.calls {
		if !cs.approved || cs.output != nil {
			continue
		}
		if cs.started {
			running = append(running, cs.id)
		} else {
			queued = append(queued, cs)
		}
	}
	r.mu.Unlock()
	if len(queued) > 0 {
		if s, err := r.d.JS.Stream(ctx, omni.ToolsStream); err == nil {
			for _, cs := range queued {
				if err := s.DeleteMsg(ctx, cs.jobSeq); err != nil {
					running = append(running, cs.id) // a runner took it meanwhile
				}
			}
		}
	}
	if len(running) > 0 {
		r.cancelRunning(ctx, running)
	}
	r.abortChildren(ctx)
	ab := omni.Abort(omni.AbortedByUser)
	// A loss earlier in the run does not keep abort off the stream.
	if _, err := r.pub.Settle(ctx); err != nil {
		r.pub.Resume()
	}
	if err := r.publishSync(ctx, &ab, ""); err != nil {
		r.log.Error().Err(err).Msg("could not publish abort")
	}
}

func (r *Runner) cancelRunning(ctx context.Context, ids []string) {
	inbox := r.d.NC.NewRespInbox()
	replies := make(chan *nats.Msg, 64)
	sub, err := r.d.NC.ChanSubscribe(inbox, replies)
	if err != nil {
		r.log.Error().Err(err).Msg("cancel subscription failed")
		return
	}
	defer sub.Unsubscribe()
	body, _ := omni.Pack(&omni.Cancel{ToolCallIDs: ids})
	if err := r.d.NC.PublishRequest(omni.CancelSubject(r.sid), inbox, body); err != nil {
		r.log.Error().Err(err).Msg("cancel publish failed")
		return
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	timeout := time.NewTimer(r.d.Settings.CancelWait)
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
			r.log.Warn().Int("unconfirmed", len(want)).Msg("runners did not confirm cancellation in time")
			return
		case <-ctx.Done():
			return
		}
	}
}
