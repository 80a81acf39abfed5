package task

import (
	"context"
	"strings"

	"github.com/rs/zerolog"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/engine/internal/fold"
	"floe.dev/services/engine/internal/model"
)

// CompactionPrompt is appended to the old context to ask for a summary.
const CompactionPrompt = "Summarize the conversation so far for your own later use: the user's goals, what was done (files, commands, results), decisions and open questions. Reply with the summary only, wrapped in [summary]...[/summary]."

// compactor runs the Task's compactions: when one is due (reason), the
// compaction request on the reconnect ladder (summarize) and the new
// context's head after a completed one.
//
// Concurrency: every method runs on the agent loop's goroutine (Run's
// start and run); the compactor keeps no state of its own between calls:
// what it reads is the history, the Session record and the model side.
type compactor struct {
	d      *Deps
	log    zerolog.Logger
	sid    string
	rec    *omni.SessionRecord
	llm    *llm
	hist   *history
	prod   *producers
	ladder *ladder
	abort  *abortScope
}

// reason returns the trigger due before the next request, or "".
func (c *compactor) reason() string {
	var last, turns int64
	c.hist.read(func(fc *fold.Context) { last, turns = fc.LastRequestTotal, fc.Turns })
	cfg := c.rec.Compaction
	threshold := c.llm.info.ContextWindow - 2048
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
func (c *compactor) run(ctx, actx context.Context, reason string) string {
	mode := c.rec.Compaction.Mode
	if mode == "" {
		mode = omni.ModeSummarize
	}
	var empty bool
	var last, turns int64
	c.hist.read(func(fc *fold.Context) { empty, last, turns = fc.Empty(), fc.LastRequestTotal, fc.Turns })
	if empty {
		return Completed
	}
	begin := omni.CompactionBegin(reason, mode, last, turns)
	c.prod.publish(&begin, "")

	_, span := c.d.Tel.Tracer().Start(actx, telemetry.OpCompaction, trace.WithAttributes(
		telemetry.ConversationID.String(c.sid), telemetry.CompactionReason.String(reason), telemetry.CompactionMode.String(mode)))
	sctx, sactx := withSpan(ctx, actx, span) // its summary requests are its children
	res := compaction{status: omni.StatusCompleted, final: true}
	if mode == omni.ModeSummarize {
		res = c.summarize(sctx, sactx)
	}
	if res.status != omni.StatusCompleted && res.status != omni.StatusAborted {
		res.status = omni.StatusFailed
	}
	span.SetAttributes(telemetry.CompactionStatus.String(res.status), telemetry.Attempt.Int64(res.attempt))
	if res.status == omni.StatusFailed {
		span.SetStatus(codes.Error, res.errMsg)
	}
	span.End()
	end := omni.CompactionEnd(reason, mode, res.status)
	end.Payload.Attempt = res.attempt
	if res.status != omni.StatusCompleted {
		end.Payload.ErrorMessage = res.errMsg
	}
	c.prod.publish(&end, "")
	if res.status == omni.StatusAborted {
		return Aborted
	}
	if res.status != omni.StatusCompleted {
		return Failed
	}
	// The carry-over belonged to the old context.
	if len(c.rec.CarryOver) > 0 {
		c.rec.CarryOver = nil
		_, _ = c.d.Sessions.Update(ctx, c.sid, func(rec *omni.SessionRecord) error {
			rec.CarryOver = nil
			return nil
		})
	}
	c.publishHead()
	return Completed
}

// publishHead starts a new context after a completed compaction: the next
// Trace file's session_meta and tool_list_ready, then the summary as the
// [context_summary] user text the original writes there (Trace only).
func (c *compactor) publishHead() {
	meta := sessionMeta(c.sid, c.llm.info, c.rec, c.d.Settings.SystemPrompt)
	c.prod.publish(&meta, "")
	tl := omni.ToolListReady(c.llm.tools)
	c.prod.publish(&tl, "")
	c.publishSummary()
}

// publishSummary writes the context's summary (if any) as the
// [context_summary] user text, Trace only.
func (c *compactor) publishSummary() {
	var summary string
	c.hist.read(func(fc *fold.Context) { summary = fc.Summary })
	if summary != "" {
		m := omni.UserText(omni.Block(omni.TagContextSummary, summary))
		c.prod.publishClass(&m, omni.ClassTrace, "")
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
func (c *compactor) summarize(ctx, actx context.Context) compaction {
	prompt := omni.UserText(CompactionPrompt)
	c.prod.publishClass(&prompt, omni.ClassTrace, "")
	var res compaction
	status, n := c.ladder.climb(actx, 1, func(attempt int) (string, bool) {
		res = c.summarizeOnce(ctx, actx, attempt)
		return res.status, res.final
	})
	if status == omni.StatusAborted && res.status != omni.StatusAborted {
		// Aborted while waiting to retry: the last attempt's error stays.
		return compaction{status: omni.StatusAborted, attempt: int64(n), errMsg: res.errMsg}
	}
	return res
}

// summarizeOnce runs attempt n of the compaction request.
func (c *compactor) summarizeOnce(ctx, actx context.Context, attempt int) compaction {
	rb := omni.RequestBegin()
	c.prod.publishClass(&rb, omni.ClassTrace, "")
	var text, other strings.Builder
	req := &model.Request{
		SessionID:    c.sid,
		Model:        c.llm.info.ModelID,
		SystemPrompt: systemPrompt(c.rec, c.d.Settings.SystemPrompt),
		Messages:     c.hist.modelContext(c.rec.CarryOver, CompactionPrompt),
		IDs:          &c.llm.ids,
	}
	res, err := c.llm.prov.Stream(actx, req, func(d model.Delta) error {
		switch d.Type {
		case omni.TypeText:
			text.WriteString(d.Text)
		case omni.TypeToolCall:
			other.WriteString(d.Name)
		}
		return nil
	})
	c.llm.usage = c.llm.usage.Add(res.Usage)
	tu := omni.TokenUsage(c.llm.usage, res.Usage)
	out := text.String()
	// status is the request's own; unusable is why a request that
	// completed still cannot complete the compaction.
	status, msg, unusable := omni.StatusCompleted, "", ""
	switch {
	case err != nil:
		status, msg = model.StatusOf(err), err.Error()
		if c.abort.aborted() {
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
		c.prod.publishClass(&m, omni.ClassTrace, "")
	}
	c.prod.publish(&tu, "")
	c.ladder.noteErr(err)
	wait, _ := c.ladder.retryIn(attempt, status)
	re := omni.RequestEnd(status, msg, int64(attempt), wait.Milliseconds())
	c.prod.publishClass(&re, omni.ClassTrace, "")
	n := int64(attempt)
	if unusable != "" {
		c.log.Warn().Int64("attempt", n).Str("reason", unusable).Msg("compaction answer unusable")
		return compaction{omni.StatusFailed, n, unusable, true}
	}
	if err == nil {
		// The summary replaces the context only if the stream took
		// all of the compaction request.
		if perr := c.prod.settleResume(ctx); perr != nil {
			c.log.Error().Err(perr).Msg("could not publish compaction output")
			return compaction{omni.StatusFailed, n, "could not record the compaction output: " + perr.Error(), true}
		}
		return compaction{omni.StatusCompleted, n, "", true}
	}
	c.log.Warn().Str("status", status).Str("error", msg).Int64("attempt", n).Msg("compaction request failed")
	return compaction{status, n, msg, false}
}

// emptySummary reports a compaction output with nothing to keep: blank, or
// only empty [summary][/summary] tags.
func emptySummary(out string) bool {
	s := fold.ExtractSummary(out)
	s = strings.NewReplacer("["+omni.TagSummary+"]", "", "[/"+omni.TagSummary+"]", "").Replace(s)
	return strings.TrimSpace(s) == ""
}
