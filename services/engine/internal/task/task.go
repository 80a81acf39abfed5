// Package task runs one Task of a Session: the agent loop of the seed.
//
// A Runner (New takes the engine's Deps) composes one value of each type
// below; each owns its state and goroutines and states its concurrency
// contract.
//
//   - lease (lease.go): fences the Task to this engine; ends the lease
//     scope with ErrLeaseLost when another engine took it over.
//   - producers (producers.go): the only ways out to FLOE_SESSIONS (the
//     Task's stream, the engine's tool outputs, server events), fenced
//     by the lease; folds what it publishes into the history; recovers a
//     request attempt that lost a message.
//   - history (history.go): the Session's folded context.
//   - control (control.go): the control inbox (approve, abort, steer,
//     retry-now, pending) and the steering queue; an inbox (inbox.go)
//     serves it and the runners' heartbeats.
//   - ladder (ladder.go): the reconnect ladder of every model request.
//   - approvals (approvals.go): decides each call (policy, mode, human)
//     and dispatches it; abortScope is the user-abort scope.
//   - calls (calls.go): a turn's calls: jobs, heartbeats, outputs read
//     back from the stream, pairing, the stop of outstanding jobs.
//   - compactor (compact.go): compaction triggers and requests.
//   - subagents (subagents.go): child Sessions of run_subagent calls.
//   - hooks.go: the Session's hooks, user_prompt and stop run by the
//     Runner, pre_tool_use by the approvals.
//   - chatSpan (spans.go): a model request attempt on the Task's trace.
//
// How a Task flows: Run (task.go) loads the Session record, takes the
// lease, opens the producers and inboxes, replays the history (Trace,
// then stream) and follows tool outputs. run resolves the model, closes
// what a dead engine left open, publishes the head and input, then loops:
// compactor before a request; request (request.go) climbs the ladder,
// each attempt streaming the model into the producers while approvals
// decide each completed call (stored decision, then job or subagent) and
// calls collect outputs; the next request starts when every call has its
// output. At the end: a boundary compaction, abort (calls stopped,
// children aborted), leftover steering carried over, intake stopped,
// producers settled, the Session released, task_state idle; the tracer
// writes the Trace. Then the engine may call NameSession (title.go).
package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	oteltrace "go.opentelemetry.io/otel/trace"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine/internal/fold"
	"floe.dev/services/engine/internal/hooks"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/snapshot"
)

// Settings are the engine-wide knobs a Task uses.
type Settings struct {
	Pool             string
	RetryBase        time.Duration // first reconnect wait (2 s)
	RetryCap         time.Duration // longest wait (30 s)
	RetryMax         int           // reconnects after the first attempt (5)
	HeartbeatTimeout time.Duration // a started tool job with no heartbeat for this long is lost
	CancelWait       time.Duration // how long abort waits for runners to confirm
	ToolListTimeout  time.Duration // how long to wait for a runner to list its tools
	DefaultMaxTurns  int           // 0 = unlimited
	SystemPrompt     string        // default system prompt; %s gets the Workspace
	MaxSubagentDepth int           // how deep run_subagent may nest (0 = no subagents)
	Home             string        // $FLOE_HOME: resume from its Traces when present
	AckWait          time.Duration // the task consumer's ack wait: a stall this long loses the Task
	// PublishAckTimeout bounds each wait of the Task's producers for the
	// stream (0: pkg/bus/publish's default, 5 s); past it a message counts
	// as lost.
	PublishAckTimeout time.Duration
	// PublishSyncDeadline bounds the retries of a message with a Msg-Id
	// the stream does not take (0: pkg/bus/publish's default, 1 min).
	PublishSyncDeadline time.Duration
}

// Deps are the connections a Task uses.
type Deps struct {
	NC *nats.Conn
	JS jetstream.JetStream
	// PubJS is what the Task's publish.Publishers use: a connection without
	// reconnect buffer (bus.PublishJS); nil means JS.
	PubJS    jetstream.JetStream
	Sessions *bus.Sessions
	Log      zerolog.Logger
	Settings Settings
	// Resolve returns the provider of a model reference.
	Resolve func(ref string) (model.Provider, model.Info, error)
	// Tools lists the runner pool's tools and its MCP servers' connect
	// results (cached by the engine while there are none).
	Tools func(ctx context.Context) (omni.ToolList, error)
	// MCPServers names the pool's MCP servers without connecting them
	// (nil func or empty: none).
	MCPServers func(ctx context.Context) ([]string, error)
	// Snapshots, when set, gives a Task's start its folded history from a
	// context snapshot plus what came after it; nil folds the whole
	// history (trace.Replay) every time.
	Snapshots *snapshot.Store
	// Hooks runs the deployment's hooks (nil: none).
	Hooks *hooks.Runner
	// Tel puts the Task's work on its trace (nil: off).
	Tel *telemetry.Provider
	// PartialsEnded, when set, is told at a Task's end that the Session's
	// partial messages below upTo belong to ended Tasks (purge.Purger).
	PartialsEnded func(sid string, upTo uint64)
	// TaskEnded, when set, is told that a Task of the Session ended (the
	// idle purge, purge.Purger.TaskEnded).
	TaskEnded func(sid string)
}

// Outcome statuses of a Task.
const (
	Completed = omni.StatusCompleted
	Failed    = omni.StatusFailed
	Aborted   = omni.StatusAborted
)

// llm is the model side of the Task: resolved by run before the first
// request (tools by start), then used on the agent loop's goroutine only;
// ids is also observed by Run before any goroutine starts.
type llm struct {
	prov  model.Provider
	info  model.Info
	ids   model.IDAllocator
	tools []omni.ToolSpec
	usage omni.Usage
}

// Runner runs one Task. Create with New, then Run once.
//
// Concurrency: no context is stored; they flow as parameters. Run owns two
// scopes: the lease scope (its ctx, derived from the engine's), which ends
// when the engine stops or another engine takes the Task (ErrLeaseLost),
// and the abort scope (actx, derived from it), which a user abort also
// ends. Code that must go on after a user abort (the request's end, the
// abort itself, a subagent's forwarding to the child's end) takes the
// lease scope; the model stream, approvals and the wait for outputs take
// the abort scope. Run owns every goroutine of the Task through its parts
// and joins them before it returns. The Runner's own fields belong to the
// goroutine running Run: rec is loaded before any other goroutine starts
// (the parts share the pointer and only read it, but for CarryOver, which
// only the agent loop touches); retryNext and beginID are the agent
// loop's.
type Runner struct {
	d    *Deps
	log  zerolog.Logger
	task omni.Task
	sid  string
	rec  *omni.SessionRecord
	llm  *llm

	lease  *lease
	hist   *history
	prod   *producers
	calls  *calls
	appr   *approvals
	subs   *subagents
	ctl    *control
	ladder *ladder
	comp   *compactor
	abort  *abortScope

	retryNext bool
	// beginID is the Msg-Id of a request_begin the stream never
	// confirmed: the next attempt sends it again (see attempt).
	beginID string
}

// New prepares a Runner for t.
func New(d *Deps, t omni.Task) *Runner {
	log := d.Log.With().Str("session_id", t.SessionID).Str("task_id", t.ID).Logger()
	sid := t.SessionID
	rec, m := new(omni.SessionRecord), new(llm)
	l := newLease(d.Sessions, sid, t.ID, d.Settings.AckWait)
	h := newHistory()
	prod := newProducers(d, sid, t.ID, l, h, log)
	abort := new(abortScope)
	c := newCalls(d, log, sid, h, prod, abort)
	subs := newSubagents(d, log, t, rec, prod, abort)
	appr := &approvals{d: d, log: log, sid: sid, taskID: t.ID, rec: rec, prod: prod, calls: c, subs: subs, abort: abort,
		pending: make(map[string]*approval)}
	lad := newLadder(d.Settings)
	return &Runner{
		d: d, log: log, task: t, sid: sid, rec: rec, llm: m,
		lease: l, hist: h, prod: prod, calls: c, appr: appr, subs: subs, ladder: lad, abort: abort,
		ctl:  &control{nc: d.NC, sid: sid, log: log, appr: appr, subs: subs, abort: abort, ladder: lad},
		comp: &compactor{d: d, log: log, sid: sid, rec: rec, llm: m, hist: h, prod: prod, ladder: lad, abort: abort},
	}
}

// Run executes the Task and returns its outcome status. It returns an error
// only when the Task could not be run at all and should be retried by
// another engine (the bus is unavailable); every other failure is an
// outcome on the stream.
func (r *Runner) Run(ctx context.Context) (status string, err error) {
	rec, _, err := r.d.Sessions.Get(ctx, r.sid)
	if err == nil && rec.TaskID != r.task.ID {
		// A replicated bucket may answer a direct get from a replica that
		// has not seen the Begin of this Task yet: before dropping the
		// Task as not the Session's, ask the stream leader, which holds
		// every acknowledged write (it failed 12 Tasks in 220 around node
		// restarts).
		rec, _, err = r.d.Sessions.GetLatest(ctx, r.sid)
	}
	if err != nil {
		return "", fmt.Errorf("task: load session: %w", err)
	}
	*r.rec = *rec
	if rec.TaskID != r.task.ID {
		if releasedTask(rec.Released) == r.task.ID {
			// A delivery of this Task released the Session and may have
			// died before its end reached the stream (killed between the
			// two): the end goes out now unless it is there.
			r.log.Warn().Str("status", rec.LastStatus).Msg("task released by an earlier delivery; making sure of its end")
			if err := r.owedEnd(ctx, r.task.ID, rec.LastStatus); err != nil {
				return "", err
			}
			return rec.LastStatus, nil
		}
		r.log.Warn().Str("owner_task", rec.TaskID).Msg("task no longer owns the session; dropped")
		return "", nil
	}
	// Take the lease: a stalled engine that lost this Task to a
	// redelivery finds another lease and stops.
	ctx, err = r.lease.take(ctx)
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			return "", nil
		}
		return "", fmt.Errorf("task: take lease: %w", err)
	}
	defer r.lease.release()
	r.calls.setBeatKey(r.lease.beatKey, r.lease.newKey)
	r.prod.open()
	defer r.prod.close()
	r.lease.watch(ctx)
	defer r.lease.stop()
	// The abort scope: a user abort (control) ends it, and with it the
	// model stream, approvals and the wait for outputs; ctx (the lease
	// scope) goes on for what the Task publishes after an abort.
	actx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	r.abort.cancel = abort

	// Control requests and heartbeats arrive on channel subscriptions and
	// are served by goroutines Run owns and joins: no NATS callback
	// goroutine ever calls into the Task or waits on a request.
	if err := r.ctl.open(); err != nil {
		return "", fmt.Errorf("task: control subscription: %w", err)
	}
	defer r.ctl.close()
	if err := r.calls.openHeartbeats(); err != nil {
		return "", fmt.Errorf("task: heartbeat subscription: %w", err)
	}
	defer r.calls.closeHeartbeats()

	r.endOfPrevious(ctx)
	if _, err := r.prod.server(ctx, omni.ServerEvent{Type: omni.ServerTaskState, State: stateOf(r.task), TaskID: r.task.ID}, r.task.ID+"/begin"); err != nil {
		return "", err
	}

	var (
		lastSeq uint64
		bad     int
	)
	if r.d.Snapshots != nil {
		var fc *fold.Context
		fc, lastSeq, bad, err = r.d.Snapshots.Load(ctx, r.sid, r.rec.CreatedUnixMs, r.rec.PurgedThrough)
		if err == nil {
			r.hist.restore(fc)
		}
	} else {
		lastSeq, bad, err = trace.Replay(ctx, r.d.JS, r.d.Settings.Home, r.sid, r.hist.apply, r.hist.reset)
	}
	if err != nil {
		return "", err
	}
	if bad > 0 {
		r.log.Warn().Int("skipped", bad).Msg("undecodable records in session history skipped")
	}
	r.prod.replayed = lastSeq
	r.hist.read(func(fc *fold.Context) { r.llm.usage = fc.Usage })
	// The context's call ids are taken: looked up when an id is assigned
	// (O(1)), not listed at every Task's start (O(history)).
	r.llm.ids.SetUsed(r.hist.hasCall)

	outputs, err := r.calls.follow(actx, lastSeq+1)
	if err != nil {
		return "", err
	}
	defer outputs()

	status = r.run(ctx, actx)
	leftover := r.ctl.closeSteering()
	r.appr.wait()
	if ctx.Err() != nil {
		if errors.Is(context.Cause(ctx), ErrLeaseLost) {
			r.log.Warn().Msg("lost the Task to another engine; stopped")
			return "", ErrLeaseLost
		}
		return "", fmt.Errorf("task: engine shutting down: %w", ctx.Err())
	}
	if status == Aborted {
		r.finishAbort(ctx)
	}
	// Steering that never reached a request is unsubmitted input: the next
	// run's model gets it as carry-over (the seed's max_turns case).
	for _, text := range leftover {
		r.saveCarryOver(ctx, omni.Block(omni.TagUserSteering, text))
	}
	// Stop serving control requests before the Session is released: a
	// client that saw the Task end finds no responder, and a Task started
	// next (on any engine) is the only one answering.
	r.ctl.stopIntake()
	r.prod.settle(ctx)
	r.lease.stop()
	if errors.Is(context.Cause(ctx), ErrLeaseLost) {
		return "", ErrLeaseLost
	}
	// The Task's last partial, found while it still holds the Session: no
	// other Task's partial can be at or below it.
	var lastPartial uint64
	if r.d.PartialsEnded != nil {
		lastPartial, _ = bus.LastStored(ctx, r.d.JS, omni.SessionSubject(r.sid, omni.ClassPartial))
	}
	// The release and the end are the Task's last words, whatever ends
	// the lease scope meanwhile (the engine shutting down; a producer
	// asking the lease after the release, which reads "lost").
	ectx := context.WithoutCancel(ctx)
	released, err := r.release(ectx, status)
	if errors.Is(err, ErrLeaseLost) {
		r.log.Warn().Msg("lost the Task to another engine before releasing it; stopped")
		return "", ErrLeaseLost
	}
	if err != nil {
		r.log.Error().Err(err).Msg("could not release the session")
	}
	if released {
		if err := r.publishEnd(ectx, r.task.ID, status); err != nil {
			// Not acked: the redelivery finds the Session released by
			// this Task and publishes the end.
			return "", err
		}
	}
	if lastPartial > 0 {
		r.d.PartialsEnded(r.sid, lastPartial+1)
	}
	if r.d.TaskEnded != nil {
		r.d.TaskEnded(r.sid)
	}
	return status, nil
}

// release moves the Session back to idle with status if it still names
// this Task and lease, and reports whether this Runner released it
// (Sessions.End, knowing). The record keeps which delivery released it
// (Released): a try whose write was applied but whose answer was lost (a
// leader change of the bucket) finds its own mark on the next try and
// still reports the release; reading only "the record names no Task"
// there left a Task without its end (3 of 9 runs of 200 Tasks on the
// cut-links cluster). The write is retried with backoff for up to two
// minutes (the engine keeps the Task meanwhile): a release given up on
// leaves the Session running for ever, refusing new Tasks (5 Sessions in
// 200 Tasks, their release timing out while the bucket's leader was cut
// off). ErrLeaseLost: another delivery of the Task holds the record.
func (r *Runner) release(ctx context.Context, status string) (bool, error) {
	mark := r.task.ID + "/" + r.lease.tokenOf()
	now := time.Now().UnixMilli()
	released := false
	_, err := retry.Do(ctx, retry.Exponential(200*time.Millisecond, 5*time.Second), 2*time.Minute, func() (struct{}, error) {
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := r.d.Sessions.Update(uctx, r.sid, func(rec *omni.SessionRecord) error {
			released = false
			switch {
			case rec.TaskID == r.task.ID && rec.Lease != r.lease.tokenOf():
				return ErrLeaseLost
			case rec.TaskID == r.task.ID:
				rec.State, rec.TaskID, rec.LastStatus = omni.StateIdle, "", status
				rec.Released, rec.ReleasedUnixMs = mark, now
				released = true
			default:
				// Released by an earlier try of this Runner (its answer
				// lost), or ended by someone else (a gateway abort of an
				// orphan), who published the end.
				released = rec.Released == mark
				return errAlreadyReleased
			}
			return nil
		})
		switch {
		case errors.Is(err, errAlreadyReleased):
			return struct{}{}, nil
		case errors.Is(err, bus.ErrSessionNotFound), errors.Is(err, ErrLeaseLost):
			released = false
			return struct{}{}, retry.Permanent(err)
		case err != nil:
			released = false
		}
		return struct{}{}, err
	}, func(err error, wait time.Duration) {
		r.log.Warn().Err(err).Dur("retry_in", wait).Msg("cannot release the session yet; retrying")
	})
	return released && err == nil, err
}

// errAlreadyReleased aborts a release's write: the record names no longer
// this Task, there is nothing to write.
var errAlreadyReleased = errors.New("task: session no longer names the task")

// owedEndWindow is how long after a Task's release the next Task's
// engine makes sure of its end: well inside FLOE_SESSIONS' duplicate
// window (10 min), so an end published twice is stored once, and longer
// than the ack wait after which the Task itself is redelivered (whose
// delivery then makes sure of it).
const owedEndWindow = 2 * time.Minute

// releasedTask is the Task named by a record's Released mark ("" when
// none).
func releasedTask(mark string) string {
	if i := strings.LastIndexByte(mark, '/'); i > 0 {
		return mark[:i]
	}
	return ""
}

// endOfPrevious makes sure, before this Task's begin, of the end of the
// Task an engine released just before it: an engine killed between that
// release and its end left the Session idle without it, and this Task
// began before that Task's redelivery (3 of 9 runs of 200 Tasks through
// engine kills on the cut-links cluster lost one end this way or by a
// release's lost answer). Best effort: a failure is logged.
func (r *Runner) endOfPrevious(ctx context.Context) {
	prev := releasedTask(r.rec.Released)
	if prev == "" || prev == r.task.ID || time.Since(time.UnixMilli(r.rec.ReleasedUnixMs)) > owedEndWindow {
		return
	}
	if err := r.owedEnd(ctx, prev, r.rec.LastStatus); err != nil {
		r.log.Warn().Err(err).Str("previous_task", prev).Msg("could not make sure of the previous Task's end")
	}
}

// owedEnd publishes task_state idle of taskID with status unless the
// Session's last server event (read from the stream's leader) is that
// end already.
func (r *Runner) owedEnd(ctx context.Context, taskID, status string) error {
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, data, err := bus.LastMessage(gctx, r.d.JS, omni.SessionSubject(r.sid, omni.ClassServer))
	cancel()
	if err != nil {
		return err
	}
	var ev omni.ServerEvent
	if data != nil && json.Unmarshal(data, &ev) == nil && ev.Type == omni.ServerTaskState && ev.State == omni.StateIdle && ev.TaskID == taskID {
		return nil
	}
	// Usually the releasing engine is about to publish it (a client that
	// polls the record began this Task first): both copies carry the
	// Msg-Id, one is stored, and it precedes this Task's begin.
	r.log.Info().Str("ended_task", taskID).Str("status", status).Msg("a released Task's end is not on the stream yet; publishing it")
	return r.publishEnd(ctx, taskID, status)
}

// publishEnd publishes the Task's task_state idle once the Session is
// released. Not through the lease-fenced producer: the release ended the
// lease (the record names no Task now), and a fence asked after a stale
// confirmation refused the end, leaving a Task without one (1 in 200 on
// the cut-links cluster). Everything the Task queued is stored already
// (settle), so the end comes after it. Its Msg-Id stores a retried
// publish, or one of owedEnd, once (a lost ack left a Task with two ends).
func (r *Runner) publishEnd(ctx context.Context, taskID, status string) error {
	b, err := json.Marshal(omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: status, TaskID: taskID})
	if err != nil {
		return err
	}
	nm := nats.NewMsg(omni.SessionSubject(r.sid, omni.ClassServer))
	nm.Data = b
	nm.Header.Set(jetstream.MsgIDHeader, taskID+"/end")
	_, err = retry.Do(ctx, retry.Exponential(100*time.Millisecond, 2*time.Second), 30*time.Second, func() (*jetstream.PubAck, error) {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return r.d.pubJS().PublishMsg(actx, nm)
	}, nil)
	if err != nil {
		r.log.Error().Err(err).Msg("could not publish task_state idle")
		return fmt.Errorf("task: publish task_state idle: %w", err)
	}
	return nil
}

// finishAbort stops the Task's outstanding tool jobs and publishes abort as
// the run's last message (case A: each stopped tool's runner has published
// its aborted output, [interrupted: tool aborted by user], before it
// confirms, so those outputs precede abort; calls never dispatched get the
// placeholder in the next request only). Jobs still queued are deleted
// from the work queue; running ones are cancelled and the runners confirm
// they will publish nothing more, so nothing of this run lands after
// abort; children are aborted and forwarded to their end.
func (r *Runner) finishAbort(ctx context.Context) {
	r.calls.stop(ctx)
	r.subs.abortAll(ctx)
	ab := omni.Abort(omni.AbortedByUser)
	// A loss earlier in the run does not keep abort off the stream.
	r.prod.resumeAfterLoss(ctx)
	if err := r.prod.publishSync(ctx, &ab, ""); err != nil {
		r.log.Error().Err(err).Msg("could not publish abort")
	}
}

func stateOf(t omni.Task) string {
	if t.Kind == omni.TaskCompact {
		return omni.StateCompacting
	}
	return omni.StateRunning
}

// run is the agent loop; it returns the outcome.
// ctx is the lease scope, actx the abort scope derived from it.
func (r *Runner) run(ctx, actx context.Context) string {
	var err error
	r.llm.prov, r.llm.info, err = r.d.Resolve(r.rec.Model)
	if err != nil {
		r.log.Error().Err(err).Str("model", r.rec.Model).Msg("unknown model")
		m := omni.Text(omni.RoleAssistant, fmt.Sprintf("[cannot run: %v]", err))
		m.Payload.StopReason = omni.StatusFailed
		r.prod.publish(&m, "")
		return Failed
	}
	oteltrace.SpanFromContext(ctx).SetAttributes(telemetry.ProviderName.String(r.llm.info.Provider),
		telemetry.RequestModel.String(r.llm.info.ModelID))
	// A compaction left open by an engine that died is closed as failed
	// before anything else is appended.
	var reason, mode string
	var ok bool
	r.hist.read(func(fc *fold.Context) { reason, mode, ok = fc.PendingCompaction() })
	if ok {
		end := omni.CompactionEnd(reason, mode, omni.StatusFailed)
		r.prod.publish(&end, "")
	}
	if err := r.start(ctx, actx); err != nil {
		if r.abort.aborted() {
			return Aborted
		}
		r.log.Error().Err(err).Msg("task start failed")
		return Failed
	}
	if r.task.Kind == omni.TaskCompact {
		return r.comp.run(ctx, actx, omni.CompactManual)
	}

	// A request left open by an engine that died is closed as failed and
	// retried; committed calls still without output are awaited.
	var openRequest bool
	r.hist.read(func(fc *fold.Context) { openRequest = fc.OpenRequest() })
	if openRequest {
		if err := r.closeDeadRequest(ctx); err != nil {
			r.log.Error().Err(err).Msg("could not close the request a dead engine left open")
			return Failed
		}
		r.retryNext = true
	}
	var open []string
	r.hist.read(func(fc *fold.Context) { open = fc.Unpaired() })
	if unpaired := r.calls.resume(open); len(unpaired) > 0 {
		if err := r.calls.await(actx, unpaired); err != nil {
			return Aborted
		}
	}

	// A compaction due when the Task starts compacts what came before it:
	// the Task's own input opens the new context instead of being
	// summarized (or discarded) with the old one.
	if reason := r.comp.reason(); reason != "" {
		if r.comp.run(ctx, actx, reason) == Aborted {
			return Aborted
		}
	}
	redelivered, refused, err := r.publishInput(ctx, actx)
	if err != nil {
		if r.abort.aborted() {
			return Aborted
		}
		r.log.Error().Err(err).Msg("task input could not be published")
		return Failed
	}
	if refused {
		return Failed
	}
	if !redelivered {
		// The open request belonged to an earlier Task (its request_end
		// was lost, e.g. with a torn Trace line): this Task's first
		// request is not a retry of it.
		r.retryNext = false
	}

	maxTurns := r.rec.MaxTurns
	if maxTurns == 0 {
		maxTurns = r.d.Settings.DefaultMaxTurns
	}
	for turn := 0; ; turn++ {
		if r.abort.aborted() {
			return Aborted
		}
		if maxTurns > 0 && turn >= maxTurns {
			r.publishMaxTurnsNotice(maxTurns)
			r.stopHooks(ctx, actx, false)
			return r.atBoundary(ctx, actx, Failed)
		}
		// Mid-Task a compaction runs only before a request, and discard
		// (which would drop the Task's own work) waits for the boundary.
		if reason := r.comp.reason(); turn > 0 && reason != "" && r.rec.Compaction.Mode != omni.ModeDiscard {
			if r.comp.run(ctx, actx, reason) == Aborted {
				return Aborted
			}
			// A failed compaction keeps the old context; the run goes on.
		}
		r.deliverSteering(actx, false)
		status, calls := r.request(ctx, actx)
		switch status {
		case omni.StatusCompleted:
		case omni.StatusAborted, statusShutdown:
			return Aborted
		default:
			r.stopHooks(ctx, actx, false)
			return Failed
		}
		if len(calls) == 0 {
			// Steering that came during the answer is the next input;
			// then a stop hook's continue; without either the run ends
			// and takes no more.
			if r.deliverSteering(actx, false) {
				continue
			}
			if input := r.stopHooks(ctx, actx, true); input != "" {
				m := harnessText(input)
				r.prod.publish(&m, "")
				continue
			}
			if r.deliverSteering(actx, true) {
				continue
			}
			return r.atBoundary(ctx, actx, Completed)
		}
		if err := r.calls.await(actx, calls); err != nil {
			return Aborted
		}
	}
}

// atBoundary checks the compaction triggers at the Task boundary, after
// the Task's last request_end and before it goes idle, and compacts when
// one is due; the Task keeps its outcome unless the compaction is aborted.
func (r *Runner) atBoundary(ctx, actx context.Context, outcome string) string {
	if reason := r.comp.reason(); reason != "" {
		if r.comp.run(ctx, actx, reason) == Aborted {
			return Aborted
		}
	}
	return outcome
}

// publishMaxTurnsNotice streams the max-turns notice like any text:
// partial_text start → delta → stop (stop_reason failed), then the complete
// text, which ends the run (no abort follows).
func (r *Runner) publishMaxTurnsNotice(n int) {
	text := omni.MaxTurnsNotice(n)
	start := omni.Partial(omni.TypeText, omni.EventStart, "", "", "")
	delta := omni.Partial(omni.TypeText, omni.EventDelta, text, "", "")
	stop := omni.Partial(omni.TypeText, omni.EventStop, "", "", "")
	stop.Payload.StopReason = omni.StatusFailed
	m := omni.Text(omni.RoleAssistant, text)
	m.Payload.StopReason = omni.StatusFailed
	for _, p := range []*omni.Message{&start, &delta, &stop, &m} {
		r.prod.publish(p, "")
	}
}

// start lists the tools and publishes the Session head (first Task). With
// MCP servers configured on the pool, every Task start (not a manual
// compaction) reports the connecting as the original does (protocol.md §7):
// mcp_connect_begin{servers} before the runner connects them,
// mcp_connect_end{status, results} after, then tool_list_ready, since
// either may have changed. Every publish carries a Msg-Id derived from the
// Task, so an engine that takes over a redelivered Task does not publish
// it twice.
func (r *Runner) start(ctx, actx context.Context) error {
	var servers []string
	if r.d.MCPServers != nil && r.task.Kind != omni.TaskCompact {
		var err error
		if servers, err = r.d.MCPServers(actx); err != nil {
			return fmt.Errorf("list MCP servers: %w", err)
		}
	}
	mcp := len(servers) > 0
	var first, closed bool
	r.hist.read(func(fc *fold.Context) {
		first = fc.Meta == nil
		// A Trace that ends in a completed compaction without the new
		// context's head (an engine stopped right after it, or an
		// imported file of the original's) gets that head now, before
		// anything of this Task.
		closed = !first && fc.Closed
	})
	publishMeta := func() error {
		if !first && !closed {
			return nil
		}
		meta := sessionMeta(r.sid, r.llm.info, r.rec, r.d.Settings.SystemPrompt)
		_, err := r.prod.publishOnce(ctx, &meta, r.task.ID+"/meta")
		return err
	}
	if mcp {
		if err := publishMeta(); err != nil {
			return err
		}
		begin := omni.MCPConnectBegin(servers)
		if _, err := r.prod.publishOnce(ctx, &begin, r.task.ID+"/mcp-begin"); err != nil {
			return err
		}
	}
	list, err := r.d.Tools(actx)
	if mcp {
		results := list.MCP
		if err != nil {
			results = make([]omni.MCPConnectResult, len(servers))
			for i, s := range servers {
				results[i] = omni.MCPConnectResult{Server: s, Status: omni.StatusFailed, Error: err.Error()}
			}
		}
		end := omni.MCPConnectEnd(results)
		if _, perr := r.prod.publishOnce(ctx, &end, r.task.ID+"/mcp-end"); perr != nil && err == nil {
			return perr
		}
	}
	if err != nil {
		return fmt.Errorf("list tools: %w", err)
	}
	tools := list.Tools
	if r.rec.Depth < r.d.Settings.MaxSubagentDepth {
		tools = append(append([]omni.ToolSpec(nil), tools...), SubagentSpec())
	}
	r.llm.tools = tools
	r.appr.setTools(tools)
	if !mcp {
		if err := publishMeta(); err != nil {
			return err
		}
	}
	if first || closed || mcp {
		tl := omni.ToolListReady(tools)
		if _, err := r.prod.publishOnce(ctx, &tl, r.task.ID+"/tools"); err != nil {
			return err
		}
	}
	if closed {
		r.comp.publishSummary()
	}
	return nil
}

// publishInput publishes the Task's user input, each part with a Msg-Id
// derived from the Task (a redelivered Task does not publish it twice). It
// reports whether the stream had the input already: the Task was
// redelivered after its engine stopped. The user_prompt hooks see the
// input's text first: their context goes before it as harness texts, and
// a deny publishes the refusal instead of the input (refused).
func (r *Runner) publishInput(ctx, actx context.Context) (redelivered, refused bool, err error) {
	if r.d.Hooks.Has(omni.HookUserPrompt) {
		var texts []string
		for _, in := range r.task.Input {
			if in.Type != "image_url" {
				texts = append(texts, in.Text)
			}
		}
		out := r.promptHooks(actx, strings.Join(texts, "\n"))
		if r.abort.aborted() {
			return false, false, errAborted
		}
		if out.Deny {
			m := refusal("prompt", out)
			_, err := r.prod.publishOnce(ctx, &m, r.task.ID+"/refused")
			return false, true, err
		}
		for i, c := range out.Context {
			m := harnessText(c)
			if _, err := r.prod.publishOnce(ctx, &m, fmt.Sprintf("%s/hook-context/%d", r.task.ID, i)); err != nil {
				return false, false, err
			}
		}
	}
	for i, in := range r.task.Input {
		var m omni.Message
		switch in.Type {
		case "image_url":
			m = omni.Model(omni.Payload{Type: omni.TypeImageURL, Role: omni.RoleUser, ImageURL: in.ImageURL})
		default:
			m = omni.UserText(in.Text)
		}
		dup, err := r.prod.publishOnce(ctx, &m, fmt.Sprintf("%s/in/%d", r.task.ID, i))
		if err != nil {
			return false, false, err
		}
		redelivered = redelivered || dup
	}
	return redelivered, false, nil
}

// closeDeadRequest closes the request a dead engine left open: the model
// segment it left open (a start, maybe deltas, no stop) gets a stop, then
// its complete message with what was streamed and stop_reason failed, so
// the streaming discipline holds across a takeover (tool-output segments
// belong to runners and are left); then the request_end, stored (with a
// Msg-Id of this delivery) before the retry's request_begin.
func (r *Runner) closeDeadRequest(ctx context.Context) error {
	end := omni.RequestEnd(omni.StatusFailed, "the engine running this request stopped", 1, 0)
	_, err := r.prod.closeRequest(ctx, 0, r.prod.attemptMsgID(0, 0), nil, &end, true)
	return err
}

// sessionMeta builds the head of a context: the first Task's and every
// completed compaction's. prompt is the engine's default system prompt.
func sessionMeta(sid string, info model.Info, rec *omni.SessionRecord, prompt string) omni.Message {
	return omni.SessionMeta(omni.Meta{
		SessionID:          sid,
		Provider:           info.Provider,
		ModelID:            info.ModelID,
		ModelContextWindow: info.ContextWindow,
		SystemPrompt:       systemPrompt(rec, prompt),
		Workspace:          rec.Workspace,
		Source:             sourceOf(rec),
	})
}

func sourceOf(rec *omni.SessionRecord) string {
	if rec.Parent != "" {
		return "subagent"
	}
	return ""
}

// systemPrompt is the Session's system prompt (or the engine's default,
// its %s the Workspace) with the Session's instructions.
func systemPrompt(rec *omni.SessionRecord, def string) string {
	return omni.WithInstructions(basePrompt(rec, def), rec.Instructions)
}

func basePrompt(rec *omni.SessionRecord, p string) string {
	if rec.SystemPrompt != "" {
		return rec.SystemPrompt
	}
	if p == "" {
		p = "You are Floe, an agent that works in the workspace %s. Use the tools to inspect and change files and run commands; answer concisely."
	}
	if strings.Contains(p, "%s") {
		return fmt.Sprintf(p, rec.Workspace)
	}
	return p
}

// statusShutdown is request's status when the engine stops mid-request.
const statusShutdown = "shutdown"
