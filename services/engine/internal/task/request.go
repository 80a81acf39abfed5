package task

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"floe.dev/pkg/bus/publish"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/segment"
)

// request runs one model request on the reconnect ladder (ladder.go) and
// returns its final status and the tool calls it committed (in call
// order). ctx is the lease scope, actx the abort scope.
func (r *Runner) request(ctx, actx context.Context) (string, []string) {
	first := 1
	var retried string // the [turn_retried] block of the previous attempt
	if r.retryNext {
		// The previous engine's attempt failed; this is its retry.
		r.retryNext = false
		first = 2
		retried = omni.Block(omni.TagTurnRetried, "The previous attempt was interrupted before it completed.")
	}
	var calls []string
	status, _ := r.climb(actx, first, func(attempt int) (string, bool) {
		var status string
		var final bool
		status, calls, retried, final = r.attempt(ctx, actx, attempt, retried)
		return status, final
	})
	if status != omni.StatusCompleted {
		calls = nil
	}
	return status, calls
}

// attempt runs attempt n of a model request, retried being the
// [turn_retried] block of the previous one. It returns the attempt's
// status, the calls it committed, the [turn_retried] block for the next
// attempt, and final when the ladder must stop whatever the status.
func (r *Runner) attempt(ctx, actx context.Context, attempt int, retried string) (status string, calls []string, next string, final bool) {
	// A loss before this attempt is not its own: resume the Task's
	// stream. Everything of the attempt comes after sequence from.
	from, perr := r.pub.Settle(ctx)
	if perr != nil {
		r.pub.Resume()
		from, _ = r.pub.Settle(ctx)
	}
	r.attemptFrom.Store(from + 1)
	r.inAttempt.Store(true)
	// The begin is stored before anything of the attempt goes out (with a
	// Msg-Id, retried until stored): a request_end can then never end a
	// request whose begin the stream lost. A begin the stream does not
	// confirm fails the attempt unseen (nothing more of it goes out, the
	// model is not called), and the ladder retries it; the next attempt
	// sends the same begin (Msg-Id) again, so a begin stored although it
	// was never confirmed (a slow leader) becomes that attempt's, never a
	// second one.
	begin := omni.RequestBegin()
	if r.beginID == "" {
		r.beginID = r.attemptMsgID(from+1, attempt) + "/begin"
	}
	if _, err := r.publishOnce(ctx, &begin, r.beginID); err != nil {
		r.pub.Resume()
		r.inAttempt.Store(false)
		if ctx.Err() != nil || errors.Is(err, publish.ErrFenced) {
			return statusShutdown, nil, "", true
		}
		r.log.Warn().Err(err).Int("attempt", attempt).Msg("request_begin not stored; the attempt is retried")
		return omni.StatusTimeout, nil, retried, false
	}
	r.beginID = ""

	queue := make(chan omni.Message, 256)
	approvalsDone := make(chan struct{})
	r.workers.Add(1)
	go func() {
		defer r.workers.Done()
		r.approveLoop(ctx, actx, queue, approvalsDone)
	}()

	seg := segment.New(func(m *omni.Message) error {
		// The call's approval decision goes out only if nothing the
		// Task published from here on was lost (publishDecision).
		gen := r.pub.Token()
		r.publish(m, "")
		if m.Payload.Type == omni.TypeToolCall && m.Payload.Stop() == omni.StatusCompleted {
			calls = append(calls, m.Payload.ToolCallID)
			r.mu.Lock()
			r.calls[m.Payload.ToolCallID] = &callState{id: m.Payload.ToolCallID, name: m.Payload.Name,
				gen: gen, from: r.attemptFrom.Load()}
			r.mu.Unlock()
			queue <- *m
		}
		return nil
	}, &r.ids)

	req := &model.Request{
		SessionID:     r.sid,
		Model:         r.info.ModelID,
		SystemPrompt:  r.systemPrompt(),
		Messages:      r.contextMessages(retried),
		Tools:         r.tools,
		ThinkingLevel: r.task.ThinkingLevel,
		IDs:           &r.ids,
	}
	res, err := r.prov.Stream(actx, req, seg.Add)
	if ctx.Err() != nil {
		// The engine is shutting down: leave the request open; the
		// engine that takes the Task over closes it as failed and retries.
		close(queue)
		<-approvalsDone
		return statusShutdown, nil, "", true
	}
	status, errMsg := omni.StatusCompleted, ""
	if err == nil && res.StopReason != "" && res.StopReason != omni.StatusCompleted {
		// The stream ended cleanly but the model refused (content
		// filter, refusal): the turn is not a success.
		err = &model.Error{Status: res.StopReason, Message: "the model stopped with " + res.StopReason}
	}
	if err != nil {
		status, errMsg = model.StatusOf(err), errorText(err)
		if r.aborted() {
			status = omni.StatusAborted
		}
	}
	stopReason := ""
	if status != omni.StatusCompleted {
		stopReason = status
	}
	_ = seg.Finish(stopReason)
	close(queue)
	// Per-Task settling: the attempt's messages are all stored, or one
	// was lost and nothing after it was stored.
	_, perr = r.pub.Settle(ctx)
	lost := perr != nil && !errors.Is(perr, publish.ErrFenced) && ctx.Err() == nil
	if !lost {
		r.inAttempt.Store(false)
	}
	if lost && status == omni.StatusCompleted {
		// Part of the attempt never reached the stream (no leader
		// during an election, a dropped connection): fail it, so its
		// retry restores it.
		status, errMsg = omni.StatusTimeout, "the stream did not store part of this request: "+perr.Error()
	}

	r.usage = r.usage.Add(res.Usage)
	tu := omni.TokenUsage(r.usage, res.Usage)
	wait, _ := r.retryIn(attempt, status)
	var end omni.Message
	switch status {
	case omni.StatusCompleted:
		reportAttempt := int64(0)
		if attempt > 1 {
			reportAttempt = int64(attempt)
		}
		end = omni.RequestEnd(omni.StatusCompleted, "", reportAttempt, 0)
	case omni.StatusAborted:
		end = omni.RequestEnd(omni.StatusAborted, "", int64(attempt), 0)
	default:
		end = omni.RequestEnd(status, errMsg, int64(attempt), wait.Milliseconds())
	}
	switch {
	case lost:
		// Close the attempt's open segments with what the stream
		// holds, then its token_usage and request_end; calls whose
		// complete message was lost never ran and are not awaited.
		stored := r.recoverAttempt(ctx, from+1, attempt, &tu, &end)
		kept := calls[:0]
		r.mu.Lock()
		for _, id := range calls {
			if stored[id] {
				kept = append(kept, id)
			} else {
				delete(r.calls, id)
			}
		}
		r.mu.Unlock()
		calls = kept
		r.inAttempt.Store(false)
	case status == omni.StatusCompleted:
		r.publish(&tu, "")
		r.publish(&end, "")
	default:
		if err := r.publishSync(ctx, &tu, ""); err != nil {
			r.log.Error().Err(err).Msg("could not publish token_usage")
		}
		if status == omni.StatusAborted {
			r.publish(&end, "")
		} else if err := r.publishSync(ctx, &end, ""); err != nil {
			r.log.Error().Err(err).Msg("could not publish request_end")
		}
	}

	if status == omni.StatusCompleted {
		return status, calls, "", true
	}
	if status == omni.StatusAborted {
		r.saveCarryOver(ctx, omni.Block(omni.TagTurnAborted, describe(seg.Completed, nil)))
		<-approvalsDone
		return status, nil, "", true
	}

	r.log.Warn().Str("status", status).Int("attempt", attempt).Str("error", errMsg).Msg("model request failed")

	// Calls of the failed attempt already ran or run now: wait for them,
	// so they are never executed twice, and tell the model what they did.
	<-approvalsDone
	if err := r.awaitOutputs(actx, calls); err != nil {
		return omni.StatusAborted, nil, "", true
	}
	next = omni.Block(omni.TagTurnRetried, fmt.Sprintf(
		"The previous attempt failed (%s: %s). Its partial output is below; tool calls marked executed already ran and must not be repeated, incomplete ones never ran.\n%s",
		status, errMsg, describe(seg.Completed, r.outputsOf(calls))))
	return status, nil, next, false
}

// contextMessages is the folded context with the carry-over of an earlier
// interrupted run inserted where it happened, plus extra model-only text.
func (r *Runner) contextMessages(extra string) []*omni.Message {
	r.mu.Lock()
	msgs := r.fc.Messages()
	r.mu.Unlock()
	if len(r.rec.CarryOver) > 0 {
		out := make([]*omni.Message, 0, len(msgs)+len(r.rec.CarryOver))
		ci := 0
		for i := 0; i <= len(msgs); i++ {
			for ci < len(r.rec.CarryOver) && r.rec.CarryOver[ci].At <= i {
				out = append(out, new(omni.UserText(r.rec.CarryOver[ci].Text)))
				ci++
			}
			if i < len(msgs) {
				out = append(out, msgs[i])
			}
		}
		msgs = out
	}
	if extra != "" {
		msgs = append(msgs, new(omni.UserText(extra)))
	}
	return msgs
}

// saveCarryOver stores model-context-only text for later runs: it goes in
// at the current end of the context, never on the stream or in the Trace.
func (r *Runner) saveCarryOver(ctx context.Context, text string) {
	r.mu.Lock()
	at := len(r.fc.Messages())
	r.mu.Unlock()
	item := omni.CarryItem{At: at, Text: text}
	_, err := r.d.Sessions.Update(ctx, r.sid, func(rec *omni.SessionRecord) error {
		rec.CarryOver = append(rec.CarryOver, item)
		return nil
	})
	if err != nil {
		r.log.Error().Err(err).Msg("could not save carry-over")
	}
	r.rec.CarryOver = append(r.rec.CarryOver, item)
}

// describe renders partial output (and tool results) as plain text for a
// [turn_retried] or [turn_aborted] block.
func describe(msgs []omni.Message, outputs map[string]string) string {
	var b strings.Builder
	for _, m := range msgs {
		p := &m.Payload
		switch p.Type {
		case omni.TypeThinking:
			fmt.Fprintf(&b, "(thinking) %s\n", p.Thinking)
		case omni.TypeText:
			fmt.Fprintf(&b, "%s\n", p.Text)
		case omni.TypeToolCall:
			if p.Stop() != omni.StatusCompleted {
				fmt.Fprintf(&b, "(incomplete tool call %s %s %s: not executed)\n", p.ToolCallID, p.Name, p.Arguments)
				continue
			}
			if out, ok := outputs[p.ToolCallID]; ok {
				fmt.Fprintf(&b, "(tool call %s %s %s: executed)\n(tool output %s) %s\n", p.ToolCallID, p.Name, p.Arguments, p.ToolCallID, out)
			} else {
				fmt.Fprintf(&b, "(tool call %s %s %s)\n", p.ToolCallID, p.Name, p.Arguments)
			}
		}
	}
	if b.Len() == 0 {
		return "(no output yet)"
	}
	return strings.TrimRight(b.String(), "\n")
}

func (r *Runner) outputsOf(ids []string) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(ids))
	for _, id := range ids {
		if cs := r.calls[id]; cs != nil && cs.output != nil {
			out[id] = cs.output.Payload.Output
		}
	}
	return out
}

// deliverSteering publishes queued steering input as user texts; it
// reports whether there was any.
func (r *Runner) deliverSteering() bool {
	r.mu.Lock()
	queued := r.steering
	r.steering = nil
	r.mu.Unlock()
	return r.publishSteering(queued)
}

// deliverSteeringOrClose is deliverSteering for the end of a run: when
// nothing is queued it closes steering intake in the same critical
// section, so a steer arriving later is refused instead of accepted and
// never delivered.
func (r *Runner) deliverSteeringOrClose() bool {
	r.mu.Lock()
	queued := r.steering
	r.steering = nil
	if len(queued) == 0 {
		r.steerClosed = true
	}
	r.mu.Unlock()
	return r.publishSteering(queued)
}

// closeSteering stops taking steering and returns what is still queued.
func (r *Runner) closeSteering() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	queued := r.steering
	r.steering, r.steerClosed = nil, true
	return queued
}

func (r *Runner) publishSteering(queued []string) bool {
	for _, text := range queued {
		m := omni.UserText(omni.Block(omni.TagUserSteering, text))
		r.publish(&m, "")
	}
	return len(queued) > 0
}

// errorText is a failure's message without the status prefix the
// request_end already carries.
func errorText(err error) string {
	var me *model.Error
	if errors.As(err, &me) {
		if me.HTTPStatus != 0 {
			return fmt.Sprintf("HTTP %d: %s", me.HTTPStatus, me.Message)
		}
		return me.Message
	}
	return err.Error()
}
