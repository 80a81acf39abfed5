package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/gateway/client"
)

const (
	maxInputParts    = 256
	maxThinkingLevel = 32
	// submitTimeout bounds Begin → publish → (End on failure): it runs
	// detached from the request so a client hanging up mid-way cannot leave a
	// record held by a Task that was never queued.
	submitTimeout = 15 * time.Second
)

func validateInput(req *client.TaskRequest) *apiError {
	if len(req.Input) == 0 {
		return badRequest("input is empty")
	}
	if len(req.Input) > maxInputParts {
		return badRequest("input has more than %d parts", maxInputParts)
	}
	for i, p := range req.Input {
		switch p.Type {
		case client.InputText:
			if p.Text == "" || p.ImageURL != "" {
				return badRequest("input[%d]: a text part needs text and no imageUrl", i)
			}
		case client.InputImageURL:
			if p.ImageURL == "" || p.Text != "" {
				return badRequest("input[%d]: an image_url part needs imageUrl and no text", i)
			}
		default:
			return badRequest("input[%d]: type %q is not text or image_url", i, p.Type)
		}
	}
	if len(req.ThinkingLevel) > maxThinkingLevel {
		return badRequest("thinkingLevel is longer than %d bytes", maxThinkingLevel)
	}
	for _, c := range req.ThinkingLevel {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return badRequest("thinkingLevel %q has characters other than a-z, 0-9, - and _", req.ThinkingLevel)
		}
	}
	return nil
}

func (s *Server) handleTask(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	var req client.TaskRequest
	if e := s.decodeBody(w, r, &req, false); e != nil {
		return e
	}
	if e := validateInput(&req); e != nil {
		return e
	}
	input := make([]omni.InputPart, len(req.Input))
	for i, p := range req.Input {
		input[i] = omni.InputPart{Type: p.Type, Text: p.Text, ImageURL: p.ImageURL}
	}
	task := omni.Task{Kind: omni.TaskRun, SessionID: rec.ID, Input: input, ThinkingLevel: req.ThinkingLevel}
	if e := s.fitsBus(&task); e != nil {
		return e
	}
	if e := s.submit(w, r, rec, omni.StateRunning, task); e != nil {
		return e
	}
	s.titleFromPrompt(context.WithoutCancel(r.Context()), rec, input)
	return nil
}

func (s *Server) handleCompact(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	var req struct{}
	if e := s.decodeBody(w, r, &req, true); e != nil {
		return e
	}
	if st := stateOf(rec); st != omni.StateIdle {
		return busyError(st)
	}
	h, err := s.history(r.Context(), rec, false, nil)
	if err != nil {
		return unavailable("read history", err)
	}
	if !h.hasModelAfterHead() {
		return errorf(http.StatusConflict, omni.CodeNothingToCompact, "the session has no messages to compact")
	}
	task := omni.Task{Kind: omni.TaskCompact, SessionID: rec.ID}
	return s.submit(w, r, rec, omni.StateCompacting, task)
}

// busHeadroom is what a message needs on the bus beyond its body: subject,
// headers (message id, content type) and the envelope's timestamp.
const busHeadroom = 4 << 10

// fitsBus answers 413 when task, or one of the prompt messages the engine
// will publish for its input (a JSON-escaped text can be several times
// longer than its decoded form), would exceed the bus's maximum message
// size: refused here, before anything is queued, rather than a Task that
// fails when the engine publishes its prompt.
func (s *Server) fitsBus(task *omni.Task) *apiError {
	limit := s.nc.MaxPayload() - busHeadroom
	if limit <= 0 {
		return nil // not connected: the publish reports it
	}
	tooLarge := func(what string, n int) *apiError {
		return errorf(http.StatusRequestEntityTooLarge, omni.CodeTooLarge,
			"%s is %d bytes as a bus message, over the bus's limit of %d", what, n, limit)
	}
	if b, err := omni.Pack(task); err == nil && len(b) > int(limit) {
		return tooLarge("the task", len(b))
	}
	for i, in := range task.Input {
		m := omni.UserText(in.Text)
		if in.Type == client.InputImageURL {
			m = omni.Model(omni.Payload{Type: omni.TypeImageURL, Role: omni.RoleUser, ImageURL: in.ImageURL})
		}
		if b, err := omni.Marshal(&m); err == nil && len(b) > int(limit) {
			return tooLarge(fmt.Sprintf("input[%d]", i), len(b))
		}
	}
	return nil
}

// submit moves the record from idle to state with a compare-and-set (one
// winner across every gateway replica), then queues the Task on FLOE_TASKS
// and waits for the stream's ack. If queueing fails the record goes back to
// idle and the caller gets 503.
func (s *Server) submit(w http.ResponseWriter, r *http.Request, rec *omni.SessionRecord, state string, task omni.Task) *apiError {
	id, e := s.submitTask(r.Context(), rec, state, task)
	if e != nil {
		return e
	}
	writeJSON(w, http.StatusAccepted, client.TaskAccepted{TaskID: id})
	return nil
}

// submitTask is submit without the HTTP answer: it returns the queued
// Task's id. The standard protocols (AG-UI, A2A) queue their Tasks here.
func (s *Server) submitTask(rctx context.Context, rec *omni.SessionRecord, state string, task omni.Task) (string, *apiError) {
	if st := stateOf(rec); st != omni.StateIdle {
		return "", busyError(st)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rctx), submitTimeout)
	defer cancel()
	task.ID = "task-" + randHex(8)
	if _, err := s.sessions.Begin(ctx, rec.ID, state, task.ID); err != nil {
		var busy *bus.ErrBusy
		switch {
		case errors.As(err, &busy):
			return "", busyError(busy.State)
		case errors.Is(err, bus.ErrSessionNotFound):
			return "", errNotFound
		}
		return "", unavailable("begin task", err)
	}
	h := nats.Header{}
	telemetry.Inject(ctx, h) // the Task's invoke_agent is this request's child
	if _, err := bus.SubmitTask(ctx, s.js, &task, h); err != nil {
		if endErr := s.sessions.End(ctx, rec.ID, task.ID, rec.LastStatus); endErr != nil {
			s.log.Error().Err(endErr).Str("session_id", rec.ID).Str("task_id", task.ID).Msg("release session after failed submit")
		}
		return "", unavailable("queue task", err)
	}
	s.log.Info().Str("session_id", rec.ID).Str("task_id", task.ID).Str("kind", task.Kind).Msg("task queued")
	return task.ID, nil
}
