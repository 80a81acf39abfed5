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
	var prev string // the previous attempt's status
	if first > 1 {
		prev = omni.StatusFailed // the dead engine's attempt
	}
	status, _ := r.ladder.climb(actx, first, func(attempt int) (string, bool) {
		var status string
		var final bool
		status, calls, retried, final = r.attempt(ctx, actx, attempt, retried, prev)
		prev = status
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
//
// retryOf is the status of the attempt this one retries ("" for a first).
func (r *Runner) attempt(ctx, actx context.Context, attempt int, retried, retryOf string) (status string, calls []string, next string, final bool) {
	// A loss before this attempt is not its own: resume the Task's
	// stream. Everything of the attempt comes after sequence from.
	from := r.prod.settleOrResume(ctx)
	r.prod.beginAttempt(from + 1)
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
		r.beginID = r.prod.attemptMsgID(from+1, attempt) + "/begin"
	}
	if _, err := r.prod.publishOnce(ctx, &begin, r.beginID); err != nil {
		r.prod.resume()
		r.prod.endAttempt()
		if ctx.Err() != nil || errors.Is(err, publish.ErrFenced) {
			return statusShutdown, nil, "", true
		}
		r.log.Warn().Err(err).Int("attempt", attempt).Msg("request_begin not stored; the attempt is retried")
		return omni.StatusTimeout, nil, retried, false
	}
	r.beginID = ""

	queue := make(chan omni.Message, 256)
	approvalsDone := r.appr.start(ctx, actx, queue)

	seg := segment.New(func(m *omni.Message) error {
		// The call's approval decision goes out only if nothing the
		// Task published from here on was lost (publishDecision).
		gen := r.prod.token()
		r.prod.publish(m, "")
		if m.Payload.Type == omni.TypeToolCall && m.Payload.Stop() == omni.StatusCompleted {
			calls = append(calls, m.Payload.ToolCallID)
			r.calls.add(m.Payload.ToolCallID, m.Payload.Name, gen, r.prod.attemptFrom.Load())
			r.appr.preToolUse(actx, m)
			if r.appr.denyAtOnce(actx, *m) {
				return nil
			}
			queue <- *m
		}
		return nil
	}, &r.llm.ids)

	req := &model.Request{
		SessionID:     r.sid,
		Model:         r.llm.info.ModelID,
		SystemPrompt:  systemPrompt(r.rec, r.d.Settings.SystemPrompt),
		Messages:      r.hist.modelContext(r.rec.CarryOver, retried),
		Tools:         r.llm.tools,
		ThinkingLevel: r.task.ThinkingLevel,
		IDs:           &r.llm.ids,
	}
	sctx, span := startChat(actx, r.d.Tel, r.llm.info, attempt, retryOf, req)
	res, err := r.llm.prov.Stream(sctx, req, func(d model.Delta) error { span.chunk(); return seg.Add(d) })
	if ctx.Err() != nil {
		// The engine is shutting down: leave the request open; the
		// engine that takes the Task over closes it as failed and retries.
		span.end(ctx, statusShutdown, "the engine stopped", res.Usage, nil)
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
		if r.abort.aborted() {
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
	perr := r.prod.settleStream(ctx)
	lost := perr != nil && !errors.Is(perr, publish.ErrFenced) && ctx.Err() == nil
	if lost && status == omni.StatusCompleted {
		// Part of the attempt never reached the stream (no leader
		// during an election, a dropped connection): fail it, so its
		// retry restores it.
		status, errMsg = omni.StatusTimeout, "the stream did not store part of this request: "+perr.Error()
	}

	span.end(ctx, status, errMsg, res.Usage, seg.Completed)
	r.llm.usage = r.llm.usage.Add(res.Usage)
	tu := omni.TokenUsage(r.llm.usage, res.Usage)
	r.ladder.noteErr(err)
	wait, _ := r.ladder.retryIn(attempt, status)
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
	// The token_usage and request_end are stored (Msg-Ids of the attempt)
	// before anything else of the Task goes out; after a loss the
	// attempt's open segments are closed first with what the stream holds,
	// and its calls whose complete message was lost never ran and are not
	// awaited. The attempt stays in flight meanwhile: an approval decision
	// lost with the end waits for this recovery (publishDecision).
	stored, cerr := r.prod.closeRequest(ctx, from+1, r.prod.attemptMsgID(from+1, attempt), &tu, &end, lost)
	r.prod.endAttempt()
	if lost {
		calls = r.calls.keepStored(calls, stored)
	}
	if cerr != nil {
		<-approvalsDone
		if ctx.Err() != nil || errors.Is(cerr, publish.ErrFenced) {
			return statusShutdown, nil, "", true
		}
		// No other request may begin while this one is open on the
		// stream: the Task ends failed, and the next Task closes it.
		r.log.Error().Err(cerr).Str("status", status).Int("attempt", attempt).Msg("request_end not stored; the Task stops")
		return omni.StatusFailed, nil, "", true
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
	if err := r.calls.await(actx, calls); err != nil {
		return omni.StatusAborted, nil, "", true
	}
	next = omni.Block(omni.TagTurnRetried, fmt.Sprintf(
		"The previous attempt failed (%s: %s). Its partial output is below; tool calls marked executed already ran and must not be repeated, incomplete ones never ran.\n%s",
		status, errMsg, describe(seg.Completed, r.calls.outputsOf(calls))))
	return status, nil, next, false
}

// saveCarryOver stores model-context-only text for later runs: it goes in
// at the current end of the context, never on the stream or in the Trace.
func (r *Runner) saveCarryOver(ctx context.Context, text string) {
	at := len(r.hist.messages())
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

// deliverSteering publishes queued steering input as user texts; it
// reports whether there was any. With orClose (the end of a run), when
// nothing is queued steering intake closes (control.takeSteering).
//
// With user_prompt hooks, each input is theirs first: a deny drops it (the
// refusal is shown, never fed to the model), their context goes before it.
// actx bounds the hooks.
func (r *Runner) deliverSteering(actx context.Context, orClose bool) bool {
	queued := r.ctl.takeSteering(orClose)
	delivered := false
	for _, text := range queued {
		if r.d.Hooks.Has(omni.HookUserPrompt) {
			out := r.promptHooks(actx, text)
			if out.Deny {
				m := refusal("steering", out)
				r.prod.publish(&m, "")
				continue
			}
			for _, c := range out.Context {
				m := harnessText(c)
				r.prod.publish(&m, "")
			}
		}
		m := omni.UserText(omni.Block(omni.TagUserSteering, text))
		r.prod.publish(&m, "")
		delivered = true
	}
	return delivered
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
