package server

import (
	"context"

	"floe.dev/pkg/omni"
)

// titleFromPrompt gives an untitled Session the title of its first Task's
// text. A failure is logged only: the Task runs either way.
func (s *Server) titleFromPrompt(ctx context.Context, rec *omni.SessionRecord, input []omni.InputPart) {
	if rec.Title != "" {
		return
	}
	var title string
	for _, p := range input {
		if p.Type == omni.TypeText {
			if title = omni.PromptTitle(p.Text); title != "" {
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
