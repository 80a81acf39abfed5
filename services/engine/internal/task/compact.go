package task

import (
	"context"
	"strings"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/fold"
	"floe.dev/services/engine/internal/model"
)

// CompactionPrompt is appended to the old context to ask for a summary.
const CompactionPrompt = "Summarize the conversation so far for your own later use: the user's goals, what was done (files, commands, results), decisions and open questions. Reply with the summary only, wrapped in [summary]...[/summary]."

// compactionReason returns the trigger due before the next request, or "".
func (r *Runner) compactionReason() string {
	r.mu.Lock()
	last, turns := r.fc.LastRequestTotal, r.fc.Turns
	r.mu.Unlock()
	cfg := r.rec.Compaction
	threshold := r.info.ContextWindow - 2048
	if cfg.MaxContextLength > 0 && (threshold <= 0 || cfg.MaxContextLength < threshold) {
		threshold = cfg.MaxContextLength
	}
	if threshold > 0 && last >= threshold {
		return omni.CompactContext
	}
	if cfg.MaxSessionTurns > 0 && turns >= cfg.MaxSessionTurns {
		return omni.CompactTurns
	}
	return ""
}

// compact runs one compaction, recorded as the original records it:
// compaction_begin → the compaction prompt (user text) → one bracket
// request_begin … output … token_usage → request_end per attempt →
// compaction_end{reason, mode, status, attempt, error_message?}. Only the
// two compaction events and each attempt's token_usage are streamed; the
// rest goes to the trace subject (the Trace only). A completed compaction
// starts a new context: session_meta and tool_list_ready head the next
// Trace file, then (summarize) the [context_summary] user text, also Trace
// only. One that cannot complete ends failed whatever its last attempt's
// status, keeps the old context and never rotates the Trace.
func (r *Runner) compact(ctx, actx context.Context, reason string) string {
	mode := r.rec.Compaction.Mode
	if mode == "" {
		mode = omni.ModeSummarize
	}
	r.mu.Lock()
	empty := r.fc.Empty()
	last, turns := r.fc.LastRequestTotal, r.fc.Turns
	r.mu.Unlock()
	if empty {
		return Completed
	}
	begin := omni.CompactionBegin(reason, mode, last, turns)
	r.publish(&begin, "")

	res := compaction{status: omni.StatusCompleted, final: true}
	if mode == omni.ModeSummarize {
		res = r.summarize(ctx, actx)
	}
	if res.status != omni.StatusCompleted && res.status != omni.StatusAborted {
		res.status = omni.StatusFailed
	}
	end := omni.CompactionEnd(reason, mode, res.status)
	end.Payload.Attempt = res.attempt
	if res.status != omni.StatusCompleted {
		end.Payload.ErrorMessage = res.errMsg
	}
	r.publish(&end, "")
	if res.status == omni.StatusAborted {
		return Aborted
	}
	if res.status != omni.StatusCompleted {
		return Failed
	}
	// The carry-over belonged to the old context.
	if len(r.rec.CarryOver) > 0 {
		r.rec.CarryOver = nil
		_, _ = r.d.Sessions.Update(ctx, r.sid, func(rec *omni.SessionRecord) error {
			rec.CarryOver = nil
			return nil
		})
	}
	r.publishHead()
	return Completed
}

// publishHead starts a new context after a completed compaction: the next
// Trace file's session_meta and tool_list_ready, then the summary as the
// [context_summary] user text the original writes there (Trace only).
func (r *Runner) publishHead() {
	meta := r.sessionMeta()
	r.publish(&meta, "")
	tl := omni.ToolListReady(r.tools)
	r.publish(&tl, "")
	r.publishSummary()
}

// publishSummary writes the context's summary (if any) as the
// [context_summary] user text, Trace only.
func (r *Runner) publishSummary() {
	r.mu.Lock()
	summary := r.fc.Summary
	r.mu.Unlock()
	if summary != "" {
		m := omni.UserText(omni.Block(omni.TagContextSummary, summary))
		r.publishClass(&m, omni.ClassTrace, "")
	}
}

// compaction is how a compaction's requests ended.
type compaction struct {
	status  string
	attempt int64
	errMsg  string
	final   bool // the attempt ends the ladder whatever its status
}

// summarize runs the compaction request on the reconnect ladder
// (ladder.go), each attempt in its own request bracket on the trace
// subject. Only a non-empty text answer counts: a tool call, an empty
// summary or exhausted retries fail it.
func (r *Runner) summarize(ctx, actx context.Context) compaction {
	prompt := omni.UserText(CompactionPrompt)
	r.publishClass(&prompt, omni.ClassTrace, "")
	var res compaction
	status, n := r.climb(actx, 1, func(attempt int) (string, bool) {
		res = r.summarizeOnce(ctx, actx, attempt)
		return res.status, res.final
	})
	if status == omni.StatusAborted && res.status != omni.StatusAborted {
		// Aborted while waiting to retry: the last attempt's error stays.
		return compaction{status: omni.StatusAborted, attempt: int64(n), errMsg: res.errMsg}
	}
	return res
}

// summarizeOnce runs attempt n of the compaction request.
func (r *Runner) summarizeOnce(ctx, actx context.Context, attempt int) compaction {
	rb := omni.RequestBegin()
	r.publishClass(&rb, omni.ClassTrace, "")
	var text, other strings.Builder
	req := &model.Request{
		SessionID:    r.sid,
		Model:        r.info.ModelID,
		SystemPrompt: r.systemPrompt(),
		Messages:     r.contextMessages(CompactionPrompt),
		IDs:          &r.ids,
	}
	res, err := r.prov.Stream(actx, req, func(d model.Delta) error {
		switch d.Type {
		case omni.TypeText:
			text.WriteString(d.Text)
		case omni.TypeToolCall:
			other.WriteString(d.Name)
		}
		return nil
	})
	r.usage = r.usage.Add(res.Usage)
	tu := omni.TokenUsage(r.usage, res.Usage)
	out := text.String()
	// status is the request's own; unusable is why a request that
	// completed still cannot complete the compaction.
	status, msg, unusable := omni.StatusCompleted, "", ""
	switch {
	case err != nil:
		status, msg = model.StatusOf(err), err.Error()
		if r.aborted() {
			status = omni.StatusAborted
		}
	case other.Len() > 0:
		unusable = "the compaction request answered with a tool call"
	case emptySummary(out):
		unusable = "the compaction request produced an empty summary"
	}
	// As in any request, the output comes before the request's
	// token_usage, and request_end follows it.
	if out != "" {
		m := omni.Text(omni.RoleAssistant, out)
		if err != nil {
			m.Payload.StopReason = status
		}
		r.publishClass(&m, omni.ClassTrace, "")
	}
	r.publish(&tu, "")
	wait, _ := r.retryIn(attempt, status)
	re := omni.RequestEnd(status, msg, int64(attempt), wait.Milliseconds())
	r.publishClass(&re, omni.ClassTrace, "")
	n := int64(attempt)
	if unusable != "" {
		r.log.Warn().Int64("attempt", n).Str("reason", unusable).Msg("compaction answer unusable")
		return compaction{omni.StatusFailed, n, unusable, true}
	}
	if err == nil {
		// The summary replaces the context only if the stream took
		// all of the compaction request.
		if perr := r.settleResume(ctx); perr != nil {
			r.log.Error().Err(perr).Msg("could not publish compaction output")
			return compaction{omni.StatusFailed, n, "could not record the compaction output: " + perr.Error(), true}
		}
		return compaction{omni.StatusCompleted, n, "", true}
	}
	r.log.Warn().Str("status", status).Str("error", msg).Int64("attempt", n).Msg("compaction request failed")
	return compaction{status, n, msg, false}
}

// emptySummary reports a compaction output with nothing to keep: blank, or
// only empty [summary][/summary] tags.
func emptySummary(out string) bool {
	s := fold.ExtractSummary(out)
	s = strings.NewReplacer("["+omni.TagSummary+"]", "", "[/"+omni.TagSummary+"]", "").Replace(s)
	return strings.TrimSpace(s) == ""
}
