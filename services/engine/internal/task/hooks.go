package task

import (
	"context"
	"strings"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/fold"
	"floe.dev/services/engine/internal/hooks"
)

// The Task's side of the hooks (protocol.md §7 "Hooks"): user_prompt before the
// Prompt and each steering input is published, pre_tool_use right after a
// committed call is published (approvals.preToolUse, before the command
// policy and the approval mode), stop when the Task is about to end.
// Records of pre_tool_use and stop hooks are published on the Task's
// stream.

// hookInput is the part of a hook's input every point has.
func (r *Runner) hookInput(point string) hooks.Input {
	return hooks.Input{Point: point, SessionID: r.sid, TaskID: r.task.ID, Workspace: r.rec.Workspace}
}

// publishHookRecords stores the hook events of recs, in order.
func publishHookRecords(ctx context.Context, prod *producers, recs []omni.HookRecord) error {
	for _, rec := range recs {
		m := omni.HookEvent(rec)
		if err := prod.publishSync(ctx, &m, ""); err != nil {
			return err
		}
	}
	return nil
}

// harnessText is a user text the harness wrote (a hook's context, a stop
// hook's continue input).
func harnessText(text string) omni.Message {
	m := omni.UserText(text)
	m.Payload.Sender = omni.SenderHarness
	return m
}

// refusal is the assistant text that ends a Task whose Prompt a
// user_prompt hook denied: shown to people, never fed to the model (an
// assistant message outside a request), like the max-turns notice.
func refusal(what string, out hooks.Outcome) omni.Message {
	text := "[" + what + " refused by the " + out.By + " hook"
	if out.Reason != "" {
		text += ": " + out.Reason
	}
	m := omni.Text(omni.RoleAssistant, text+"]")
	m.Payload.StopReason = omni.StatusFailed
	return m
}

// promptHooks runs the user_prompt hooks on text (a Prompt or a steering
// input). actx bounds them: a user abort ends them.
func (r *Runner) promptHooks(actx context.Context, text string) hooks.Outcome {
	in := r.hookInput(omni.HookUserPrompt)
	in.Prompt = text
	return r.d.Hooks.Run(actx, in)
}

// stopHooks runs the stop hooks as the Task is about to end and publishes
// their records. With canContinue (the model's final answer, no cutoff),
// the first continue with an input is returned: the Task's next input;
// after a cutoff (max turns, a failed request) the answers are recorded
// and not honoured, as the original does.
func (r *Runner) stopHooks(ctx, actx context.Context, canContinue bool) (input string) {
	if !r.d.Hooks.Has(omni.HookStop) {
		return ""
	}
	in := r.hookInput(omni.HookStop)
	in.LastText = r.lastText()
	out := r.d.Hooks.Run(actx, in)
	if err := publishHookRecords(ctx, r.prod, out.Records); err != nil {
		r.log.Error().Err(err).Msg("could not publish the stop hooks' records")
		return ""
	}
	if !canContinue || !out.Continue || r.abort.aborted() {
		return ""
	}
	r.log.Info().Str("hook", out.By).Msg("a stop hook continues the Task")
	return out.Input
}

// lastText is the last assistant text of the context.
func (r *Runner) lastText() string {
	var text string
	r.hist.read(func(fc *fold.Context) {
		for m := range fc.Backward() {
			p := &m.Payload
			if p.Role == omni.RoleUser && p.Type == omni.TypeText {
				return // the last answer is older than the last input
			}
			if p.Role == omni.RoleAssistant && p.Type == omni.TypeText && strings.TrimSpace(p.Text) != "" {
				text = p.Text
				return
			}
		}
	})
	return text
}
