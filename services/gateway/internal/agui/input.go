package agui

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// RunAgentInput is what a client POSTs to start or resume a run: the
// fields Floe reads (tools, context, state and forwardedProps are accepted
// and ignored: Floe's tools are its own).
type RunAgentInput struct {
	ThreadID string    `json:"threadId"`
	RunID    string    `json:"runId"`
	Messages []Message `json:"messages"`
	Resume   []Resume  `json:"resume,omitempty"`
}

// Message is one message of the client's history.
type Message struct {
	ID      string          `json:"id"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content,omitempty"`
}

// Resume answers one interrupt of the previous run.
type Resume struct {
	InterruptID string          `json:"interruptId"`
	Status      string          `json:"status"`
	Payload     json.RawMessage `json:"payload,omitempty"`
}

// Part is one part of the Prompt: text, or an image by URL (a data: URL for
// inline data).
type Part struct {
	Text     string
	ImageURL string
}

// Limits of a RunAgentInput.
const (
	maxID       = 256
	maxMessages = 10000
	maxResume   = 256
)

// ErrInput is wrapped by every error of ParseInput.
var ErrInput = errors.New("malformed RunAgentInput")

func inputErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInput, fmt.Sprintf(format, args...))
}

// ParseInput decodes and checks a RunAgentInput body: threadId and runId
// are required non-empty strings, messages an array of objects with a
// string id and role, resume entries name an interrupt and a status of
// resolved or cancelled. Unknown fields are ignored, as AG-UI's schemas
// allow them.
func ParseInput(body []byte) (*RunAgentInput, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, inputErr("%v", strings.TrimPrefix(err.Error(), "json: "))
	}
	var in RunAgentInput
	str := func(key string, dst *string) error {
		v, ok := raw[key]
		if !ok {
			return inputErr("%s is missing", key)
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return inputErr("%s is not a string", key)
		}
		if *dst == "" || len(*dst) > maxID {
			return inputErr("%s must be 1 to %d bytes", key, maxID)
		}
		return nil
	}
	if err := str("threadId", &in.ThreadID); err != nil {
		return nil, err
	}
	if err := str("runId", &in.RunID); err != nil {
		return nil, err
	}
	if v, ok := raw["messages"]; ok && !isNull(v) {
		if err := json.Unmarshal(v, &in.Messages); err != nil {
			return nil, inputErr("messages is not an array of messages: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
	}
	if len(in.Messages) > maxMessages {
		return nil, inputErr("messages has more than %d entries", maxMessages)
	}
	for i, m := range in.Messages {
		if m.ID == "" || m.Role == "" {
			return nil, inputErr("messages[%d] needs an id and a role", i)
		}
	}
	if v, ok := raw["resume"]; ok && !isNull(v) {
		if err := json.Unmarshal(v, &in.Resume); err != nil {
			return nil, inputErr("resume is not an array of resume entries")
		}
	}
	if len(in.Resume) > maxResume {
		return nil, inputErr("resume has more than %d entries", maxResume)
	}
	for i, r := range in.Resume {
		if r.InterruptID == "" {
			return nil, inputErr("resume[%d] has no interruptId", i)
		}
		if r.Status != "resolved" && r.Status != "cancelled" {
			return nil, inputErr("resume[%d].status %q is not resolved or cancelled", i, r.Status)
		}
		if _, err := r.Decision(); err != nil {
			return nil, err
		}
	}
	return &in, nil
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

// Decision is the approval decision a resume entry gives: "deny" for a
// cancelled interrupt or a payload {decision: "deny"}, else "allow".
func (r Resume) Decision() (string, error) {
	if r.Status == "cancelled" {
		return "deny", nil
	}
	if len(r.Payload) == 0 || isNull(r.Payload) {
		return "allow", nil
	}
	var p struct {
		Decision string `json:"decision"`
	}
	if json.Unmarshal(r.Payload, &p) != nil {
		return "", inputErr("resume entry for %q: payload is not {decision}", r.InterruptID)
	}
	switch p.Decision {
	case "", "allow":
		return "allow", nil
	case "deny":
		return "deny", nil
	}
	return "", inputErr("resume entry for %q: decision %q is not allow or deny", r.InterruptID, p.Decision)
}

// Prompt returns the parts of the user messages at the end of the history
// (after its last message of another role): the messages the Session does
// not hold yet, since clients resend the whole history.
func (in *RunAgentInput) Prompt() ([]Part, error) {
	start := len(in.Messages)
	for start > 0 && in.Messages[start-1].Role == "user" {
		start--
	}
	var parts []Part
	for _, m := range in.Messages[start:] {
		ps, err := contentParts(m.Content)
		if err != nil {
			return nil, inputErr("message %q: %v", m.ID, err)
		}
		parts = append(parts, ps...)
	}
	return parts, nil
}

// contentParts reads a user message's content: a string, or an array of
// text and image parts.
func contentParts(c json.RawMessage) ([]Part, error) {
	if len(c) == 0 || isNull(c) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(c, &s) == nil {
		if s == "" {
			return nil, nil
		}
		return []Part{{Text: s}}, nil
	}
	var arr []struct {
		Type   string `json:"type"`
		Text   string `json:"text"`
		Source *struct {
			Type     string `json:"type"`
			Value    string `json:"value"`
			MimeType string `json:"mimeType"`
		} `json:"source"`
	}
	if err := json.Unmarshal(c, &arr); err != nil {
		return nil, errors.New("content is not a string or an array of parts")
	}
	var out []Part
	for i, p := range arr {
		switch p.Type {
		case "text":
			if p.Text != "" {
				out = append(out, Part{Text: p.Text})
			}
		case "image":
			if p.Source == nil || p.Source.Value == "" {
				return nil, fmt.Errorf("content[%d]: an image part needs a source", i)
			}
			switch p.Source.Type {
			case "url":
				out = append(out, Part{ImageURL: p.Source.Value})
			case "data":
				out = append(out, Part{ImageURL: "data:" + p.Source.MimeType + ";base64," + p.Source.Value})
			default:
				return nil, fmt.Errorf("content[%d]: image source type %q is not url or data", i, p.Source.Type)
			}
		default:
			return nil, fmt.Errorf("content[%d]: part type %q is not supported (text, image)", i, p.Type)
		}
	}
	return out, nil
}
