// Package task runs one Task of a Session: the agent loop of the seed.
//
// Every message goes to the Session's subjects in FLOE_SESSIONS; the stream
// sequence is the order. Everything the Task publishes goes through its
// ordered producers (publish.go, pkg/bus/publish); approvals run one at a
// time beside the model stream; an approval_decision is stored (acked)
// before its tool job is enqueued, so no output can precede it;
// token_usage then request_end go out when the model stream ends, not
// waiting for tools; the next request starts when every call of the turn
// has its complete output, fed back in call order. Tool outputs are read
// back from the stream (the engine consumes its own Session's model
// subject), whoever published them.
//
// # Concurrency contract
//
// No context is stored in the Runner; they flow as parameters. Run owns
// two scopes: the lease scope (its ctx, derived from the engine's),
// which ends when the engine stops or another engine takes the Task
// (ErrLeaseLost), and the abort scope (actx, derived from it), which a
// user abort also ends. Code that must go on after a user abort (the
// request's end, the abort itself, a subagent's forwarding to the child's
// end) takes the lease scope; the model stream, approvals and the wait for
// outputs take the abort scope. The Runner keeps only the two cancel
// functions (control requests end the abort scope; the lease watcher and
// leaseValid end the lease scope) and atomic flags recording why
// (userAborted, leaseLost), which aborted and leaseValid read.
//
// Run owns every goroutine of a Task and joins them before it returns: the
// lease watcher, the two subscription servers (control requests and
// heartbeats arrive on channel subscriptions; no NATS callback goroutine
// calls into the Task), the approval loop of each request and the
// subagent runs (Runner.workers, waited for before the Task finishes; a
// subagent run joins its own abort watcher), the outputs consumer (stopped
// and drained), and the goroutines of the Task's producers (closed, after
// settling, at the end). The outputs consumer's callback only records an
// output under the mutex and signals changed; no NATS callback blocks on a
// request or calls into the Task (the control server, Run's goroutine,
// forwards an approval to a child Session with a request).
//
// Runner.mu guards the fold (fc), calls and their states, pending
// approvals, steering and its closed flag, the backoff channel (retry-now),
// children and their approvals. It is held only for reads and updates of
// those fields, never across a publish, a NATS request or a channel send
// that can block. Fields written once before the goroutines that read them
// start are not guarded: rec, lease, abort, loseLease and the producers
// (before the subscription servers start), replayed (before the outputs
// consumer starts), prov, info, tools and toolPerms
// (set by run before the first approval loop). rec.CarryOver, retryNext,
// beginID and usage belong to the goroutine running Run (the agent loop).
package task

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/publish"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine/internal/fold"
	"floe.dev/services/engine/internal/model"
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
}

// Outcome statuses of a Task.
const (
	Completed = omni.StatusCompleted
	Failed    = omni.StatusFailed
	Aborted   = omni.StatusAborted
)

// callState tracks one tool call of the running Task.
type callState struct {
	id         string
	name       string
	approved   bool // a job was enqueued
	jobSeq     uint64
	started    bool
	lastBeat   time.Time
	dispatched time.Time
	output     *omni.Message
	// gen is the Task stream's generation (publish.Publisher.Token)
	// before the call's message was queued, from the first sequence of its
	// attempt: its decision must not outlive a loss of the call.
	gen  uint64
	from uint64
}

// Runner runs one Task. Create with New, then Run once.
type Runner struct {
	d    *Deps
	log  zerolog.Logger
	task omni.Task
	sid  string
	rec  *omni.SessionRecord

	prov model.Provider
	info model.Info
	ids  model.IDAllocator

	tools     []omni.ToolSpec
	toolPerms map[string]string

	// abort ends the Task's abort scope (Run's actx) with errAborted; set
	// by Run before it serves control requests. userAborted records it.
	abort       context.CancelCauseFunc
	userAborted atomic.Bool

	mu       sync.Mutex
	fc       *fold.Context
	calls    map[string]*callState
	changed  chan struct{} // 1-buffered: a call changed state
	pending  map[string]*approval
	steering []string
	// steerClosed: the run is ending and takes no more steering (a steer
	// then is refused, never accepted and dropped).
	steerClosed bool
	backoff     chan struct{} // non-nil while waiting to reconnect
	usage       omni.Usage

	// The Task's producers (publish.go); opened by Run.
	pub, out, srv *publish.Publisher
	// attemptFrom is the first stream sequence the current request attempt
	// can have published at.
	attemptFrom atomic.Uint64
	// inAttempt is true from a request attempt's begin until its messages
	// are settled (or its loss recovered): only then may a loss be resumed
	// by anyone but the request loop (publishDecision), and only then does
	// calls say which of the attempt's calls the stream holds (ask waits
	// for it after a loss).
	inAttempt atomic.Bool

	// lease fencing (see watchLease, leaseValid): loseLease ends Run's
	// lease scope; leaseLost records that it did.
	lease      string
	loseLease  context.CancelCauseFunc
	leaseLost  atomic.Bool
	leaseCheck atomic.Int64 // unix nanos of the last confirmation
	retryNext  bool
	// replayed is the last stream sequence of the history Run folded.
	replayed uint64
	// beginID is the Msg-Id of a request_begin the stream never
	// confirmed: the next attempt sends it again (see attempt).
	beginID string

	children       map[string]string        // running child Session → its Task
	childApprovals map[string]childApproval // a child's pending calls
	// workers counts the approval loops and subagent runs; Run waits for
	// them before it finishes the Task.
	workers sync.WaitGroup
}

type approval struct {
	event    []byte // approval_request server event JSON
	decision chan string
}

var errAborted = errors.New("task aborted by user")

// New prepares a Runner for t.
func New(d *Deps, t omni.Task) *Runner {
	return &Runner{
		d:       d,
		log:     d.Log.With().Str("session_id", t.SessionID).Str("task_id", t.ID).Logger(),
		task:    t,
		sid:     t.SessionID,
		calls:   make(map[string]*callState),
		changed: make(chan struct{}, 1),
		pending: make(map[string]*approval),

		children:       make(map[string]string),
		childApprovals: make(map[string]childApproval),
	}
}

// Run executes the Task and returns its outcome status. It returns an error
// only when the Task could not be run at all and should be retried by
// another engine (the bus is unavailable); every other failure is an
// outcome on the stream.
func (r *Runner) Run(ctx context.Context) (status string, err error) {
	rec, _, err := r.d.Sessions.Get(ctx, r.sid)
	// A replicated bucket may answer a read from a replica that has not
	// seen the Begin of this Task yet: look again for a moment before
	// dropping the Task as not the Session's.
	for i := 0; err == nil && rec.TaskID != r.task.ID && i < 10; i++ {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		rec, _, err = r.d.Sessions.Get(ctx, r.sid)
	}
	if err != nil {
		return "", fmt.Errorf("task: load session: %w", err)
	}
	r.rec = rec
	if rec.TaskID != r.task.ID {
		r.log.Warn().Str("owner_task", rec.TaskID).Msg("task no longer owns the session; dropped")
		return "", nil
	}
	// Take the lease: a stalled engine that lost this Task to a
	// redelivery finds another lease and stops (see watchLease).
	lease := randomHex(8)
	if _, err := r.d.Sessions.Update(ctx, r.sid, func(rec *omni.SessionRecord) error {
		if rec.TaskID != r.task.ID {
			return ErrLeaseLost
		}
		rec.Lease = lease
		return nil
	}); err != nil {
		if errors.Is(err, ErrLeaseLost) {
			return "", nil
		}
		return "", fmt.Errorf("task: take lease: %w", err)
	}
	ctx, loseLease := context.WithCancelCause(ctx)
	defer loseLease(nil)
	r.lease, r.loseLease = lease, loseLease
	r.leaseCheck.Store(time.Now().UnixNano())
	r.openPublishers()
	defer r.closePublishers()
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		r.watchLease(ctx, lease, stopWatch)
	}()
	defer func() {
		select {
		case <-stopWatch:
		default:
			close(stopWatch)
		}
		<-watchDone
	}()
	// The abort scope: a user abort (onControl) ends it, and with it the
	// model stream, approvals and the wait for outputs; ctx (the lease
	// scope) goes on for what the Task publishes after an abort.
	actx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	r.abort = abort

	// Control requests and heartbeats arrive on channel subscriptions and
	// are served by goroutines Run owns and joins: no NATS callback
	// goroutine ever calls into the Task or waits on a request.
	ctlCh, hbCh := make(chan *nats.Msg, 64), make(chan *nats.Msg, 256)
	ctl, err := r.d.NC.ChanSubscribe(omni.ControlSubject(r.sid, "*"), ctlCh)
	if err != nil {
		return "", fmt.Errorf("task: control subscription: %w", err)
	}
	defer ctl.Unsubscribe()
	hb, err := r.d.NC.ChanSubscribe(omni.HeartbeatSubject(r.sid), hbCh)
	if err != nil {
		return "", fmt.Errorf("task: heartbeat subscription: %w", err)
	}
	defer hb.Unsubscribe()
	stopServing := make(chan struct{})
	var serving sync.WaitGroup
	for ch, serve := range map[chan *nats.Msg]func(*nats.Msg){ctlCh: r.onControl, hbCh: r.onHeartbeat} {
		serving.Add(1)
		go func() {
			defer serving.Done()
			for {
				select {
				case m := <-ch:
					serve(m)
				case <-stopServing:
					return
				}
			}
		}()
	}
	defer func() {
		close(stopServing)
		serving.Wait()
	}()

	if _, err := r.server(ctx, omni.ServerEvent{Type: omni.ServerTaskState, State: stateOf(r.task), TaskID: r.task.ID}, r.task.ID+"/begin"); err != nil {
		return "", err
	}

	r.fc = fold.New()
	lastSeq, bad, err := trace.Replay(ctx, r.d.JS, r.d.Settings.Home, r.sid, r.fc.Apply, r.fc.Reset)
	if err != nil {
		return "", err
	}
	if bad > 0 {
		r.log.Warn().Int("skipped", bad).Msg("undecodable records in session history skipped")
	}
	r.replayed = lastSeq
	r.usage = r.fc.Usage
	for _, m := range r.fc.Messages() {
		if m.Payload.Type == omni.TypeToolCall {
			r.ids.Observe(m.Payload.ToolCallID)
		}
	}

	outputs, err := r.followOutputs(actx, lastSeq+1)
	if err != nil {
		return "", err
	}
	defer outputs()

	status = r.run(ctx, actx)
	leftover := r.closeSteering()
	r.workers.Wait()
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
	_ = ctl.Unsubscribe()
	r.settle(ctx)
	close(stopWatch)
	<-watchDone
	if errors.Is(context.Cause(ctx), ErrLeaseLost) {
		return "", ErrLeaseLost
	}
	if err := r.d.Sessions.End(ctx, r.sid, r.task.ID, status); err != nil {
		r.log.Error().Err(err).Msg("could not release the session")
	}
	if _, err := r.server(ctx, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: status, TaskID: r.task.ID}, ""); err != nil {
		r.log.Error().Err(err).Msg("could not publish task_state idle")
	}
	return status, nil
}

// ErrLeaseLost means another engine took the Task over (this one stalled
// past its ack wait): the Runner stopped without publishing more, and its
// task message must be neither acked nor naked.
var ErrLeaseLost = errors.New("task: lease lost to another engine")

// watchLease checks every second that the Session record still names this
// Task and lease; when it does not, it cancels the run with ErrLeaseLost.
func (r *Runner) watchLease(ctx context.Context, lease string, stop <-chan struct{}) {
	tick := time.NewTicker(min(time.Second, r.leaseStale()/2))
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-stop:
			return
		case <-ctx.Done():
			return
		}
		rec, _, err := r.d.Sessions.Get(ctx, r.sid)
		if err != nil {
			continue // the bus is briefly unavailable; the ack wait covers it
		}
		if rec.TaskID != r.task.ID || rec.Lease != lease {
			r.lostLease()
			return
		}
		r.leaseCheck.Store(time.Now().UnixNano())
	}
}

// leaseStale is how old a lease confirmation may be before a publish
// re-checks it: a third of the ack wait, so after a stall long enough to
// lose the Task (SIGSTOP, a frozen VM) the first publish verifies
// ownership before anything reaches the stream.
func (r *Runner) leaseStale() time.Duration {
	if w := r.d.Settings.AckWait; w > 0 {
		return w / 3
	}
	return 10 * time.Second
}

// leaseValid reports whether this Runner still owns the Task. Cheap while
// the watcher confirms it every second; after a stall it asks the Session
// record itself and, on loss, cancels the run.
func (r *Runner) leaseValid() bool {
	if r.loseLease == nil {
		return true // not started through Run (benchmarks)
	}
	if r.leaseLost.Load() {
		return false
	}
	if time.Since(time.Unix(0, r.leaseCheck.Load())) < r.leaseStale() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, _, err := r.d.Sessions.Get(ctx, r.sid)
	if err != nil {
		return true // cannot tell; the watcher keeps checking
	}
	if rec.TaskID != r.task.ID || rec.Lease != r.lease {
		r.lostLease()
		return false
	}
	r.leaseCheck.Store(time.Now().UnixNano())
	return true
}

// lostLease records that another engine owns the Task and ends the lease
// scope (and with it the abort scope) with ErrLeaseLost.
func (r *Runner) lostLease() {
	r.leaseLost.Store(true)
	r.loseLease(ErrLeaseLost)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
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
	r.prov, r.info, err = r.d.Resolve(r.rec.Model)
	if err != nil {
		r.log.Error().Err(err).Str("model", r.rec.Model).Msg("unknown model")
		m := omni.Text(omni.RoleAssistant, fmt.Sprintf("[cannot run: %v]", err))
		m.Payload.StopReason = omni.StatusFailed
		r.publish(&m, "")
		return Failed
	}
	// A compaction left open by an engine that died is closed as failed
	// before anything else is appended.
	r.mu.Lock()
	reason, mode, ok := r.fc.PendingCompaction()
	r.mu.Unlock()
	if ok {
		end := omni.CompactionEnd(reason, mode, omni.StatusFailed)
		r.publish(&end, "")
	}
	if err := r.start(ctx, actx); err != nil {
		if r.aborted() {
			return Aborted
		}
		r.log.Error().Err(err).Msg("task start failed")
		return Failed
	}
	if r.task.Kind == omni.TaskCompact {
		return r.compact(ctx, actx, omni.CompactManual)
	}

	// A request left open by an engine that died is closed as failed and
	// retried; committed calls still without output are awaited.
	r.mu.Lock()
	openRequest := r.fc.OpenRequest()
	r.mu.Unlock()
	if openRequest {
		r.closeDeadSegments(ctx)
		end := omni.RequestEnd(omni.StatusFailed, "the engine running this request stopped", 1, 0)
		r.publish(&end, "")
		r.retryNext = true
	}
	r.mu.Lock()
	for _, id := range r.fc.Unpaired() {
		now := time.Now()
		r.calls[id] = &callState{id: id, approved: true, started: true, lastBeat: now, dispatched: now}
	}
	unpaired := maps(r.calls)
	r.mu.Unlock()
	if len(unpaired) > 0 {
		if err := r.awaitOutputs(actx, unpaired); err != nil {
			return Aborted
		}
	}

	// A compaction due when the Task starts compacts what came before it:
	// the Task's own input opens the new context instead of being
	// summarized (or discarded) with the old one.
	if reason := r.compactionReason(); reason != "" {
		if r.compact(ctx, actx, reason) == Aborted {
			return Aborted
		}
	}
	redelivered, err := r.publishInput(ctx)
	if err != nil {
		if r.aborted() {
			return Aborted
		}
		r.log.Error().Err(err).Msg("task input could not be published")
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
		if r.aborted() {
			return Aborted
		}
		if maxTurns > 0 && turn >= maxTurns {
			r.publishMaxTurnsNotice(maxTurns)
			return r.atBoundary(ctx, actx, Failed)
		}
		// Mid-Task a compaction runs only before a request, and discard
		// (which would drop the Task's own work) waits for the boundary.
		if reason := r.compactionReason(); turn > 0 && reason != "" && r.rec.Compaction.Mode != omni.ModeDiscard {
			if r.compact(ctx, actx, reason) == Aborted {
				return Aborted
			}
			// A failed compaction keeps the old context; the run goes on.
		}
		r.deliverSteering()
		status, calls := r.request(ctx, actx)
		switch status {
		case omni.StatusCompleted:
		case omni.StatusAborted, statusShutdown:
			return Aborted
		default:
			return Failed
		}
		if len(calls) == 0 {
			// Steering that came during the answer is the next input;
			// without any the run ends and takes no more.
			if r.deliverSteeringOrClose() {
				continue
			}
			return r.atBoundary(ctx, actx, Completed)
		}
		if err := r.awaitOutputs(actx, calls); err != nil {
			return Aborted
		}
	}
}

// atBoundary checks the compaction triggers at the Task boundary, after
// the Task's last request_end and before it goes idle, and compacts when
// one is due; the Task keeps its outcome unless the compaction is aborted.
func (r *Runner) atBoundary(ctx, actx context.Context, outcome string) string {
	if reason := r.compactionReason(); reason != "" {
		if r.compact(ctx, actx, reason) == Aborted {
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
		r.publish(p, "")
	}
}

// start lists the tools and publishes the Session head (first Task). With
// MCP servers configured on the pool, every Task start (not a manual
// compaction) reports the connecting as the original does (SPEC §7):
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
	r.mu.Lock()
	first := r.fc.Meta == nil
	// A Trace that ends in a completed compaction without the new
	// context's head (an engine stopped right after it, or an imported file
	// of the original's) gets that head now, before anything of this Task.
	closed := !first && r.fc.Closed
	r.mu.Unlock()
	publishMeta := func() error {
		if !first && !closed {
			return nil
		}
		meta := r.sessionMeta()
		_, err := r.publishOnce(ctx, &meta, r.task.ID+"/meta")
		return err
	}
	if mcp {
		if err := publishMeta(); err != nil {
			return err
		}
		begin := omni.MCPConnectBegin(servers)
		if _, err := r.publishOnce(ctx, &begin, r.task.ID+"/mcp-begin"); err != nil {
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
		if _, perr := r.publishOnce(ctx, &end, r.task.ID+"/mcp-end"); perr != nil && err == nil {
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
	r.tools = tools
	r.toolPerms = make(map[string]string, len(tools))
	for _, t := range tools {
		r.toolPerms[t.Name] = t.Permission
	}
	if !mcp {
		if err := publishMeta(); err != nil {
			return err
		}
	}
	if first || closed || mcp {
		tl := omni.ToolListReady(tools)
		if _, err := r.publishOnce(ctx, &tl, r.task.ID+"/tools"); err != nil {
			return err
		}
	}
	if closed {
		r.publishSummary()
	}
	return nil
}

// publishInput publishes the Task's user input, each part with a Msg-Id
// derived from the Task (a redelivered Task does not publish it twice). It
// reports whether the stream had the input already: the Task was
// redelivered after its engine stopped.
func (r *Runner) publishInput(ctx context.Context) (redelivered bool, err error) {
	for i, in := range r.task.Input {
		var m omni.Message
		switch in.Type {
		case "image_url":
			m = omni.Model(omni.Payload{Type: omni.TypeImageURL, Role: omni.RoleUser, ImageURL: in.ImageURL})
		default:
			m = omni.UserText(in.Text)
		}
		dup, err := r.publishOnce(ctx, &m, fmt.Sprintf("%s/in/%d", r.task.ID, i))
		if err != nil {
			return false, err
		}
		redelivered = redelivered || dup
	}
	return redelivered, nil
}

// closeDeadSegments ends the model segment a dead engine left open (a
// start, maybe deltas, no stop): stop, then its complete message with what
// was streamed and stop_reason failed, so the streaming discipline holds
// across a takeover. Tool-output segments belong to runners and are left.
func (r *Runner) closeDeadSegments(ctx context.Context) {
	if _, err := r.closeUnfinished(ctx, 0); err != nil {
		r.log.Warn().Err(err).Msg("could not read the dead request's partials")
	}
}

// sessionMeta builds the head of a context: the first Task's and every
// completed compaction's.
func (r *Runner) sessionMeta() omni.Message {
	return omni.SessionMeta(omni.Meta{
		SessionID:          r.sid,
		Provider:           r.info.Provider,
		ModelID:            r.info.ModelID,
		ModelContextWindow: r.info.ContextWindow,
		SystemPrompt:       r.systemPrompt(),
		Workspace:          r.rec.Workspace,
		Source:             sourceOf(r.rec),
	})
}

func sourceOf(rec *omni.SessionRecord) string {
	if rec.Parent != "" {
		return "subagent"
	}
	return ""
}

func (r *Runner) systemPrompt() string {
	return omni.WithInstructions(r.basePrompt(), r.rec.Instructions)
}

func (r *Runner) basePrompt() string {
	if r.rec.SystemPrompt != "" {
		return r.rec.SystemPrompt
	}
	p := r.d.Settings.SystemPrompt
	if p == "" {
		p = "You are Floe, an agent that works in the workspace %s. Use the tools to inspect and change files and run commands; answer concisely."
	}
	if strings.Contains(p, "%s") {
		return fmt.Sprintf(p, r.rec.Workspace)
	}
	return p
}

// abortByUser serves a user's abort: it ends the abort scope.
func (r *Runner) abortByUser() {
	r.userAborted.Store(true)
	r.abort(errAborted)
}

// aborted reports a user abort (not an engine shutdown or a lost lease).
func (r *Runner) aborted() bool { return r.userAborted.Load() }

// statusShutdown is request's status when the engine stops mid-request.
const statusShutdown = "shutdown"

func maps(m map[string]*callState) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	return ids
}
