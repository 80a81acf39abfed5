package server

import (
	"context"
	"strings"
	"unicode"

	"floe.dev/pkg/omni"
)

// promptTitleLen bounds a title taken from a prompt, in runes: what fits on
// a session list row.
const promptTitleLen = 60

// PromptTitle is the title a Session gets from the text of its first Task
// at once (the engine may later replace it with a shorter one from the
// model): the first non-blank line, spaces collapsed, cut at a word
// boundary near promptTitleLen runes with an ellipsis. "" when the text
// has no visible characters.
func PromptTitle(text string) string {
	var line string
	for l := range strings.Lines(text) {
		if f := strings.Fields(l); len(f) > 0 {
			line = strings.Join(f, " ")
			break
		}
	}
	line = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, line)
	return omni.ClipTitle(line, promptTitleLen)
}

// titleFromPrompt gives an untitled Session the title of its first Task's
// text. A failure is logged only: the Task runs either way.
func (s *Server) titleFromPrompt(ctx context.Context, rec *omni.SessionRecord, input []omni.InputPart) {
	if rec.Title != "" {
		return
	}
	var title string
	for _, p := range input {
		if p.Type == omni.TypeText {
			if title = PromptTitle(p.Text); title != "" {
				break
			}
		}
	}
	if title == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, submitTimeout)
	defer cancel()
	_, err := s.sessions.Update(ctx, rec.ID, func(r *omni.SessionRecord) error {
		if r.Title == "" {
			r.Title, r.TitleSource = title, omni.TitleFromPrompt
		}
		return nil
	})
	if err != nil {
		s.log.Warn().Err(err).Str("session_id", rec.ID).Msg("title from prompt")
	}
}
