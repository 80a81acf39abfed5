package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/publish"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/services/toolrunner/internal/tools"
)

// jobState is where a job is in its life; it moves only forward, from
// running to exactly one of completing or cancelled.
type jobState int

const (
	// running: the tool runs and its output streams as partials.
	running jobState = iota
	// completing: the stop fragment is out and the complete output is
	// being published; a cancel no longer stops the job.
	completing
	// cancelled: the engine stopped the job; its output segment is closed
	// as aborted and, once the job has exited, the runner publishes its
	// aborted complete output (protocol.md §6 case A); the job publishes nothing.
	cancelled
)

// job is one tool call being executed.
type job struct {
	r      *runner
	sid    string
	id     string
	key    string // jobKey(sid, id)
	token  string // the job's BeatToken, sent with every heartbeat for it
	log    zerolog.Logger
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the job's goroutine can publish nothing more
	kick   chan struct{} // cap 1: output is buffered and waits for the timed flush

	// mu guards the fields below and is held while a partial is handed to
	// the connection, so the fragments of one job leave in order and none
	// leaves after the state has moved to cancelled.
	mu      sync.Mutex
	state   jobState
	started bool            // the start fragment is out
	buf     strings.Builder // output not yet published
	sent    strings.Builder // output published as fragments

	// pub is the job's producer (pkg/bus/publish): its partials and its
	// complete output, in order. begin is when the job started (a lower
	// bound, less a margin for clock skew, of its messages' stream times).
	pub   *publish.Publisher
	begin time.Time
	// aborted is the complete output of a cancelled job: what it streamed
	// and the interrupted marker.
	aborted string
}

func jobKey(sid, id string) string { return sid + "/" + id }

// process handles one fetched message: decode, acknowledge, check, run
// under jobsCtx, publish. It runs on its own goroutine and holds one slot.
func (r *runner) process(jobsCtx context.Context, m jetstream.Msg) {
	log := r.log.With().Str("subject", m.Subject()).Logger()
	var storedAt time.Time
	if md, err := m.Metadata(); err == nil {
		storedAt = md.Timestamp
		log = log.With().Uint64("seq", md.Sequence.Stream).Logger()
	}
	var tj omni.ToolJob
	decodeErr := omni.Unpack(m.Data(), &tj)

	// At most once: the job leaves the queue before anything runs; an ack
	// that may have been applied is confirmed, never read as "not
	// delivered" (ackJob).
	if !r.ackJob(jobsCtx, m, &tj, decodeErr == nil, log) {
		return
	}
	if decodeErr != nil {
		log.Error().Err(decodeErr).Int("bytes", len(m.Data())).Msg("undecodable tool job dropped")
		return
	}
	if tj.SessionID == "" {
		tj.SessionID = sessionOfSubject(m.Subject(), r.cfg.Pool)
	}
	log = log.With().Str("session_id", tj.SessionID).Str("tool_call_id", tj.ToolCallID).Str("tool", tj.Name).Logger()
	if !omni.ValidSessionID(tj.SessionID) || tj.ToolCallID == "" {
		log.Error().Msg("tool job without a valid session id or tool call id dropped")
		return
	}
	j := &job{
		r:     r,
		sid:   tj.SessionID,
		id:    tj.ToolCallID,
		key:   jobKey(tj.SessionID, tj.ToolCallID),
		token: tj.BeatToken,
		log:   log,
		done:  make(chan struct{}),
		kick:  make(chan struct{}, 1),
		begin: time.Now(),
	}
	j.pub = publish.New(r.pubJS, publish.Options{})
	ctx, stopJob := context.WithCancelCause(jobsCtx)
	j.cancel = stopJob
	defer close(j.done)
	// Before done: everything queued is committed. A cancelled job's
	// producer belongs to the cancel from then on (replyCancel).
	defer func() {
		j.mu.Lock()
		handedOver := j.state == cancelled
		j.mu.Unlock()
		if !handedOver {
			j.pub.Close()
		}
	}()
	defer stopJob(nil)
	if reason := r.register(j, storedAt); reason != "" {
		log.Info().Str("reason", reason).Msg("tool job dropped without running")
		return
	}
	defer r.unregister(j)
	r.beat(j.sid)

	ctx, span := r.startSpan(ctx, m, &tj)
	begin := time.Now()
	var res tools.Result
	if problem := checkJob(&tj); problem != "" {
		// Published like a tool's output, so a cancel still wins.
		log.Warn().Str("problem", problem).Msg("bad tool job; publishing a failed output")
		res = tools.Result{Output: "toolrunner cannot run this tool call: " + problem, Failed: true}
	} else {
		log.Debug().Msg("tool job started")
		stopFlusher, flusherDone := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(flusherDone)
			j.flushLoop(stopFlusher)
		}()
		res = r.cfg.Tools.Execute(ctx, tools.Call{
			Name:      tj.Name,
			Arguments: tj.Arguments,
			Workspace: tj.Workspace,
			Env:       []string{"FLOE_SESSION_ID=" + tj.SessionID, "FLOE_TOOL_CALL_ID=" + tj.ToolCallID},
		}, j.emit)
		close(stopFlusher)
		<-flusherDone
	}
	j.finish(res)
	endSpan(r.cfg.Telemetry, span, ctx, res)
	log.Debug().Bool("failed", res.Failed).Dur("took", time.Since(begin)).Msg("tool job ended")
}

// doubleAck acknowledges a job and waits for the server to confirm it
// (a variable: tests make it fail).
var doubleAck = func(ctx context.Context, m jetstream.Msg) error { return m.DoubleAck(ctx) }

// ackBudget bounds how long ackJob keeps confirming one job's ack, from
// the fetch: well within the consumer's ack wait, before which the job
// is handed to nobody else, and short enough that the engine, which
// fails a job whose heartbeats stop after its heartbeat timeout (10 s by
// default) and withdraws it from the queue, does so before the ack wait
// could hand it to another runner.
var ackBudget = ackWait / 3

// ackJob takes a fetched job off the queue and reports whether this
// runner owns it and may run it. An ack whose answer does not come (a
// leader change) may have been applied, so it is never read as "not
// delivered": it is sent again until the server confirms it (a repeated
// ack of a job already acked is confirmed too), within ackBudget of the
// fetch. Meanwhile the job is reported in heartbeats (valid is false for
// a job that does not decode: nothing to report), so the engine does not
// fail it as not started while the runner decides. When the budget runs
// out the job is not run here, and that is logged: the engine then fails
// the call once the heartbeats stop, withdrawing the job if it is still
// queued, so it is run by nobody rather than twice. The same holds when
// ctx (the runner's jobs) ends while it waits to send the ack again.
func (r *runner) ackJob(ctx context.Context, m jetstream.Msg, tj *omni.ToolJob, valid bool, log zerolog.Logger) bool {
	deadline := time.Now().Add(ackBudget)
	sid := tj.SessionID
	if sid == "" {
		sid = sessionOfSubject(m.Subject(), r.cfg.Pool)
	}
	if valid && omni.ValidSessionID(sid) && tj.ToolCallID != "" {
		key := jobKey(sid, tj.ToolCallID)
		r.mu.Lock()
		r.holding[key] = heldJob{sid: sid, id: tj.ToolCallID, token: tj.BeatToken}
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			delete(r.holding, key)
			r.mu.Unlock()
		}()
	}
	backoff := retry.Exponential(100*time.Millisecond, time.Second)
	for attempt := 1; ; attempt++ {
		left := time.Until(deadline)
		actx, cancel := context.WithTimeout(context.Background(), min(ackTimeout, max(left, 0)))
		err := doubleAck(actx, m)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			if attempt > 1 {
				log.Warn().Int("attempts", attempt).Msg("ack of tool job confirmed after failures; running it")
			}
			return true
		}
		wait := backoff.NextBackOff()
		if time.Until(deadline) < wait {
			log.Error().Err(err).Int("attempts", attempt).Dur("budget", ackBudget).
				Msg("ack of tool job not confirmed (it may have been applied); job not run here: the engine fails the call once its heartbeats stop and withdraws the job")
			return false
		}
		log.Warn().Err(err).Int("attempt", attempt).Msg("ack of tool job not confirmed; sending it again")
		if retry.Sleep(ctx, wait) != nil {
			log.Error().Err(err).Int("attempts", attempt).
				Msg("ack of tool job not confirmed when the runner stopped; job not run here: the engine fails the call once its heartbeats stop")
			return false
		}
	}
}

// heldJob is a fetched job whose ack is being confirmed: reported in
// heartbeats, not running yet.
type heldJob struct{ sid, id, token string }

// checkJob returns what makes a decoded job unrunnable, or "".
func checkJob(tj *omni.ToolJob) string {
	switch {
	case tj.Name == "":
		return "the job names no tool"
	case tj.Workspace == "":
		return "the job has no workspace"
	case !filepath.IsAbs(tj.Workspace):
		return fmt.Sprintf("workspace %q is not an absolute path", tj.Workspace)
	}
	fi, err := os.Stat(tj.Workspace)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Sprintf("workspace %q does not exist", tj.Workspace)
	case err != nil:
		return fmt.Sprintf("workspace %q: %v", tj.Workspace, err)
	case !fi.IsDir():
		return fmt.Sprintf("workspace %q is not a directory", tj.Workspace)
	}
	return ""
}

// sessionOfSubject returns <sid> of floe.tool.<pool>.<sid>, or "".
func sessionOfSubject(subject, pool string) string {
	sid, ok := strings.CutPrefix(subject, omni.ToolSubject(pool, ""))
	if !ok {
		return ""
	}
	return sid
}

// emit buffers one fragment of the tool's output, publishing it at once
// when enough is buffered and otherwise leaving it to the flusher.
func (j *job) emit(fragment string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.state != running || fragment == "" {
		return
	}
	first := j.buf.Len() == 0
	j.buf.WriteString(fragment)
	if j.buf.Len() >= j.r.cfg.FlushBytes {
		j.flushLocked()
		return
	}
	if first {
		select {
		case j.kick <- struct{}{}:
		default:
		}
	}
}

// flushLoop publishes buffered output FlushDelay after its first byte,
// until stop is closed.
func (j *job) flushLoop(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-j.kick:
		}
		t := time.NewTimer(j.r.cfg.FlushDelay)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		j.mu.Lock()
		if j.state == running {
			j.flushLocked()
		}
		j.mu.Unlock()
	}
}

// flushLocked publishes the buffered output as the next fragment (start if
// none was published yet). j.mu must be held and the job running.
func (j *job) flushLocked() {
	if j.buf.Len() == 0 {
		return
	}
	s := j.buf.String()
	j.buf.Reset()
	j.publishFragmentLocked(s)
}

// publishFragmentLocked publishes s as start or delta. j.mu must be held.
func (j *job) publishFragmentLocked(s string) {
	ev := omni.EventDelta
	if !j.started {
		ev, j.started = omni.EventStart, true
	}
	j.sent.WriteString(s)
	j.publishPartialLocked(ev, s)
}

// publishPartialLocked queues one partial on the job's producer, waiting
// only while its queue is full (back-pressure); the producer keeps the
// fragments in order on the stream and stores nothing after a lost one
// (finish repairs the segment). j.mu must be held.
func (j *job) publishPartialLocked(eventType, content string) {
	j.publishPartialStopLocked(eventType, content, "")
}

// publishStopLocked publishes the segment's stop fragment with its stop
// reason ("" for none). j.mu must be held.
func (j *job) publishStopLocked(stopReason string) {
	j.publishPartialStopLocked(omni.EventStop, "", stopReason)
}

func (j *job) publishPartialStopLocked(eventType, content, stopReason string) {
	m := omni.Partial(omni.TypeToolCallOutput, eventType, content, "", j.id)
	m.Payload.StopReason = stopReason
	nm, err := bus.SessionMsg(j.sid, &m, "")
	if err == nil {
		err = j.pub.Publish(context.Background(), nm)
	}
	if err != nil {
		j.log.Warn().Err(err).Str("event_type", eventType).Msg("publish partial tool output failed")
	}
}

// finish closes the output segment and publishes the complete output,
// unless the job was cancelled: then nothing more is published.
func (j *job) finish(res tools.Result) {
	j.mu.Lock()
	if j.state != running {
		j.mu.Unlock()
		return
	}
	j.flushLocked()
	sent := j.sent.String()
	if rest, ok := strings.CutPrefix(res.Output, sent); ok {
		if rest != "" {
			j.publishFragmentLocked(rest)
		}
	} else {
		j.log.Error().Int("streamed", len(sent)).Int("output", len(res.Output)).Msg("streamed tool output is not a prefix of the result")
	}
	if !j.started {
		j.publishFragmentLocked("")
	}
	j.publishStopLocked("")
	j.state = completing
	sent = j.sent.String()
	j.mu.Unlock()

	j.settleSegment(sent)
	stop := ""
	if res.Failed {
		stop = omni.StatusFailed
	}
	if err := j.publishOutput(res.Output, stop, res.Images); err != nil {
		j.log.Error().Err(err).Msg("publish complete tool output failed; the engine will report the outcome as unknown")
	}
}

// settleSegment waits until the output segment is stored. When the stream
// lost a fragment (nothing after it was stored), it reads back what the
// stream holds of the segment and publishes the rest of sent as one
// delta, then the stop, so the stored fragments concatenate to the output
// and the segment is closed; it retries that for up to publishBudget.
func (j *job) settleSegment(sent string) {
	deadline := time.Now().Add(publishBudget)
	backoff := retry.Exponential(100*time.Millisecond, 2*time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
		_, err := j.pub.Settle(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			j.log.Error().Err(err).Msg("output segment could not be stored")
			return
		}
		j.log.Warn().Err(err).Msg("the stream lost part of the output segment; repairing")
		// No ctx bounds the repair (the output must be stored even when
		// the job was cancelled): publishBudget does.
		_ = retry.Sleep(context.Background(), backoff.NextBackOff())
		j.pub.Resume()
		stored, started, stopped, rerr := j.storedSegment()
		if rerr != nil {
			j.log.Warn().Err(rerr).Msg("cannot read back the output segment")
			continue
		}
		if stopped {
			continue // whole already: the settle failed after the last fragment
		}
		rest, ok := strings.CutPrefix(sent, stored)
		if !ok {
			j.log.Error().Int("stored", len(stored)).Int("sent", len(sent)).Msg("stored tool output is not a prefix of what was sent")
			rest = ""
		}
		ev := omni.EventDelta
		if !started {
			ev = omni.EventStart
		}
		for _, p := range []omni.Message{
			omni.Partial(omni.TypeToolCallOutput, ev, rest, "", j.id),
			omni.Partial(omni.TypeToolCallOutput, omni.EventStop, "", "", j.id),
		} {
			if nm, err := bus.SessionMsg(j.sid, &p, ""); err == nil {
				_ = j.pub.Publish(context.Background(), nm)
			}
		}
	}
}

// storedSegment reads what the stream holds of the job's output segment:
// its content so far, whether its start and stop are stored.
func (j *job) storedSegment() (content string, started, stopped bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	msgs, err := jetstreamext.GetBatch(ctx, j.r.js, omni.SessionsStream, 10000,
		jetstreamext.GetBatchSubject(omni.SessionSubject(j.sid, omni.ClassPartial)),
		jetstreamext.GetBatchStartTime(j.begin.Add(-time.Minute)))
	if err != nil {
		return "", false, false, err
	}
	var b strings.Builder
	for raw, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			break
		}
		if err != nil {
			return "", false, false, err
		}
		m, derr := omni.Decode(raw.Data)
		if derr != nil || m.Payload.ToolCallID != j.id || len(m.Origin) > 0 || m.Payload.Type != omni.TypePartialToolCallOutput {
			continue
		}
		switch m.Payload.EventType {
		case omni.EventStart:
			b.Reset()
			started, stopped = true, false
		case omni.EventStop:
			stopped = true
		}
		b.WriteString(m.Payload.Content())
	}
	return b.String(), started, stopped, nil
}

// tryCancel moves a running job to cancelled and cancels its context. It
// reports false if the job had already finished running. Once it returns,
// the job publishes nothing more (its producer is the cancel's).
func (j *job) tryCancel() (ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.state != running {
		return false
	}
	j.state = cancelled
	j.cancel(errCancelled)
	// The output so far and the interrupted marker close the segment, so
	// its deltas still concatenate to the complete output published once
	// the job has exited.
	j.flushLocked()
	marker := omni.InterruptedOutput
	if s := j.sent.String(); s != "" && !strings.HasSuffix(s, "\n") {
		marker = "\n" + marker
	}
	j.publishFragmentLocked(marker)
	j.publishStopLocked(omni.StatusAborted)
	j.aborted = j.sent.String()
	return true
}

// publishOutput publishes the complete tool_call_output after the
// segment, through the job's producer: it waits until the stream stored
// it, retrying for up to a minute. Its Nats-Msg-Id makes retries and any
// competing copy (the engine declaring the job lost) collapse into one
// stored message.
func (j *job) publishOutput(output, stopReason string, images []string) error {
	m := omni.ToolCallOutputImages(j.id, output, stopReason, images)
	nm, err := bus.SessionMsg(j.sid, &m, bus.OutputMsgID(j.sid, j.id))
	if err != nil {
		return fmt.Errorf("encode tool output: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), publishBudget+publishTimeout)
	defer cancel()
	ack, err := j.pub.Sync(ctx, nm)
	if err != nil {
		return err
	}
	if ack.Duplicate {
		j.log.Info().Msg("complete tool output was already stored")
	}
	return nil
}

// register makes j active unless it must not run; it returns why not.
func (r *runner) register(j *job, storedAt time.Time) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancelled.has(j.sid, j.id, storedAt, time.Now()) {
		return "cancelled before it started"
	}
	if _, dup := r.active[j.key]; dup {
		return "the same tool call is already running here"
	}
	r.active[j.key] = j
	return ""
}

// unregister removes j unless a cancel already did.
func (r *runner) unregister(j *job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active[j.key] == j {
		delete(r.active, j.key)
	}
}
