package task

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/fold"
	"floe.dev/services/engine/internal/model"
)

// titleTimeout bounds the title request and the record update after it.
const titleTimeout = 30 * time.Second

// titleMaxRunes caps a title from the model, as the gateway caps a title
// from the prompt: what fits on a session list row.
const titleMaxRunes = 60

// errTitleKept stops the record update when the title is no longer the
// prompt's (a person renamed the Session meanwhile).
var errTitleKept = errors.New("title no longer from the prompt")

// NameSession asks the model for a short title after a completed Task of a
// Session still titled by its first prompt (TitleSource prompt; the
// gateway sets it), and stores it as TitleSource model; the gateway
// announces the change as session_title (protocol.md §3). It is the
// original's one-off title request: the Session's own model, no tools, no
// system prompt, thinking off, written neither to the stream nor to the
// Trace, so a replay or resume sees the same requests as before. A person's
// title (TitleSource "") is never replaced, also when the rename lands
// while the request runs. A failure changes nothing: the prompt's title
// stays, and the next completed Task asks again. The engine calls it once
// Run returned status and the Task is acknowledged: the request never
// delays the person, and the next Task may already be running.
func (r *Runner) NameSession(ctx context.Context, status string) {
	if status != Completed || r.task.Kind == omni.TaskCompact || r.task.ParentSessionID != "" || r.llm.prov == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, titleTimeout)
	defer cancel()
	rec, _, err := r.d.Sessions.Get(ctx, r.sid)
	if err != nil || rec.TitleSource != omni.TitleFromPrompt {
		return
	}
	user, assistant := r.titleMaterial()
	if strings.TrimSpace(user) == "" {
		return
	}
	req := &model.Request{
		SessionID: r.sid,
		Model:     r.llm.info.ModelID,
		Messages:  []*omni.Message{new(omni.UserText(model.TitlePrompt(user, assistant)))},
		IDs:       new(model.IDAllocator),
		Purpose:   model.PurposeTitle,
	}
	var text strings.Builder
	res, err := r.llm.prov.Stream(ctx, req, func(d model.Delta) error {
		if d.Type == omni.TypeText && text.Len() < 4*model.TitleExcerptMax {
			text.WriteString(d.Text)
		}
		return nil
	})
	log := r.log.With().Int64("tokens", res.Usage.Total).Int64("output_tokens", res.Usage.Output).Logger()
	if err != nil {
		log.Info().Err(err).Msg("no title from the model; the prompt's title stays")
		return
	}
	title := sanitizeTitle(text.String())
	if title == "" {
		log.Info().Msg("the model's title is empty; the prompt's title stays")
		return
	}
	_, err = r.d.Sessions.Update(ctx, r.sid, func(rec *omni.SessionRecord) error {
		if rec.TitleSource != omni.TitleFromPrompt || rec.Deleted {
			return errTitleKept
		}
		rec.Title, rec.TitleSource = title, omni.TitleFromModel
		return nil
	})
	switch {
	case errors.Is(err, errTitleKept):
		log.Info().Msg("renamed meanwhile; the model's title is dropped")
	case err != nil:
		log.Warn().Err(err).Msg("could not store the model's title")
	default:
		log.Info().Str("title", title).Msg("titled by the model")
	}
}

// titleMaterial is what a title is made of: the Task's input text and the
// text the model answered in it (thinking and tool calls left out).
func (r *Runner) titleMaterial() (user, assistant string) {
	var u []string
	for _, p := range r.task.Input {
		if p.Type == omni.TypeText && strings.TrimSpace(p.Text) != "" {
			u = append(u, p.Text)
		}
	}
	// The answer: the assistant texts after the last user text (the
	// Task's input, or steering that came in it).
	var a []string
	r.hist.read(func(fc *fold.Context) {
		for m := range fc.Backward() {
			pl := &m.Payload
			if pl.Type != omni.TypeText {
				continue
			}
			if pl.Role == omni.RoleUser {
				break
			}
			a = append(a, pl.Text)
		}
	})
	slices.Reverse(a)
	return strings.Join(u, "\n"), strings.Join(a, "\n")
}

var (
	thinkBlock = regexp.MustCompile(`(?s)<think>.*?</think>`)
	titleEdge  = regexp.MustCompile(`^["'“”‘’「」『』《》〈〉【】()（）*_#\s]+|["'“”‘’「」『』《》〈〉【】()（）*_\s]+$`)
	titleStop  = regexp.MustCompile(`[。.．!！?？;；,，、:：]+$`)
)

// sanitizeTitle makes a model's answer a title: thinking blocks dropped,
// whitespace collapsed, surrounding quotes and brackets and final
// punctuation stripped until nothing changes, a leading "Title:" dropped,
// cut at titleMaxRunes on a word boundary; "" when nothing is left.
func sanitizeTitle(raw string) string {
	t := thinkBlock.ReplaceAllString(raw, " ")
	if i := strings.Index(t, "<think>"); i >= 0 { // an unclosed block
		t = t[:i]
	}
	t = strings.Join(strings.Fields(t), " ")
	for prev := ""; prev != t; {
		prev = t
		if k, v, ok := strings.Cut(t, ":"); ok && strings.EqualFold(strings.Trim(k, " *_#"), "title") {
			t = v
		}
		t = titleStop.ReplaceAllString(titleEdge.ReplaceAllString(t, ""), "")
		t = strings.TrimSpace(t)
	}
	return omni.ClipTitle(t, titleMaxRunes)
}
