package task

import (
	"context"
	"strings"

	"floe.dev/pkg/bus"
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

// compact runs one compaction. On the client stream it shows as
// compaction_begin → the compaction request's token_usage →
// compaction_end(status); the request's own output goes only to the Trace
// (the trace subject). A completed compaction starts a new context: a fresh
// session_meta and tool_list_ready head the next Trace file. A failed one
// keeps the old context.
func (r *Runner) compact(ctx context.Context, reason string) string {
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

	status := omni.StatusCompleted
	if mode == omni.ModeSummarize {
		status = r.summarize(ctx)
	}
	end := omni.CompactionEnd(reason, mode, status)
	r.publish(&end, "")
	if status == omni.StatusAborted {
		return Aborted
	}
	if status != omni.StatusCompleted {
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
	meta := r.sessionMeta()
	r.publish(&meta, "")
	tl := omni.ToolListReady(r.tools)
	r.publish(&tl, "")
	return Completed
}

// summarize runs the compaction request with the reconnect ladder and
// publishes its output on the trace subject. Only a non-empty text answer
// counts: a tool call, an empty summary or exhausted retries fail it.
func (r *Runner) summarize(ctx context.Context) string {
	for attempt := 1; ; attempt++ {
		var text, other strings.Builder
		req := &model.Request{
			SessionID:    r.sid,
			Model:        r.info.ModelID,
			SystemPrompt: r.systemPrompt(),
			Messages:     r.contextMessages(CompactionPrompt),
			IDs:          &r.ids,
		}
		res, err := r.prov.Stream(r.abortCtx, req, func(d model.Delta) error {
			switch d.Type {
			case omni.TypeText:
				text.WriteString(d.Text)
			case omni.TypeToolCall:
				other.WriteString(d.Name)
			}
			return nil
		})
		// As in any request, the output comes before the request's
		// token_usage, its last message.
		r.usage = r.usage.Add(res.Usage)
		tu := omni.TokenUsage(r.usage, res.Usage)
		if err == nil {
			out := text.String()
			switch {
			case other.Len() > 0:
				r.log.Warn().Msg("compaction answered with a tool call")
				r.publish(&tu, "")
				return omni.StatusFailed
			case emptySummary(out):
				r.log.Warn().Msg("compaction produced an empty summary")
				r.publish(&tu, "")
				return omni.StatusFailed
			}
			m := omni.Text(omni.RoleAssistant, out)
			r.apply(&m)
			nm, merr := bus.SessionMsgClass(r.sid, omni.ClassTrace, &m, "")
			if merr == nil {
				_, merr = r.d.JS.PublishMsgAsync(nm)
			}
			r.publish(&tu, "")
			if merr != nil {
				r.log.Error().Err(merr).Msg("could not publish compaction output")
				return omni.StatusFailed
			}
			return omni.StatusCompleted
		}
		r.publish(&tu, "")
		if r.aborted() {
			return omni.StatusAborted
		}
		status := model.StatusOf(err)
		if status == omni.StatusAuth || attempt > r.d.Settings.RetryMax {
			r.log.Warn().Err(err).Msg("compaction request failed")
			return status
		}
		if !r.sleepBackoff(r.backoffFor(attempt)) {
			return omni.StatusAborted
		}
	}
}

// emptySummary reports a compaction output with nothing to keep: blank, or
// only empty [summary][/summary] tags.
func emptySummary(out string) bool {
	s := fold.ExtractSummary(out)
	s = strings.NewReplacer("["+omni.TagSummary+"]", "", "[/"+omni.TagSummary+"]", "").Replace(s)
	return strings.TrimSpace(s) == ""
}
