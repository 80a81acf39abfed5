package hooks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"floe.dev/pkg/omni"
)

// Input is what a hook is told, as one JSON object on stdin or as the
// request body, with the original's field names (protocol.md §7).
type Input struct {
	Point     string
	SessionID string
	TaskID    string
	Workspace string
	// Prompt: user_prompt (the Prompt's or steering input's text).
	Prompt string
	// ToolName, ToolCallID and Arguments (the raw argument JSON string):
	// pre_tool_use.
	ToolName, ToolCallID, Arguments string
	// LastText: stop (the Task's last assistant text, if any).
	LastText string
}

// MarshalJSON writes the point's fields only: every hook gets hook,
// session_id, task_id and workspace; user_prompt adds prompt, pre_tool_use
// tool_name, tool_call_id and arguments, stop last_text when there is one.
func (in Input) MarshalJSON() ([]byte, error) {
	m := map[string]string{
		"hook":       in.Point,
		"session_id": in.SessionID,
		"task_id":    in.TaskID,
		"workspace":  in.Workspace,
	}
	switch in.Point {
	case omni.HookUserPrompt:
		m["prompt"] = in.Prompt
	case omni.HookPreToolUse:
		m["tool_name"] = in.ToolName
		m["tool_call_id"] = in.ToolCallID
		m["arguments"] = in.Arguments
	case omni.HookStop:
		if in.LastText != "" {
			m["last_text"] = in.LastText
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(buf.Bytes()), nil
}

// Answer is a hook's opinion. The zero Answer (a hook that answered an
// empty object) has none but is still recorded.
type Answer struct {
	// Decision: allow | deny (user_prompt, pre_tool_use), continue | stop
	// (stop); "" for none.
	Decision string
	Reason   string
	// Context (user_prompt) is added before the Prompt as a harness text.
	Context string
	// Input (stop, with continue) is the next input of the Task.
	Input string
	// Output is the hook's own record: scalars only.
	Output map[string]any
}

// ErrAnswer is wrapped by every error of ParseAnswer.
var ErrAnswer = errors.New("answer")

// maxAnswer caps an answer; a hook that writes more has failed.
const maxAnswer = 1 << 20

// ParseAnswer reads a hook's answer at point. Empty (or only whitespace)
// is no opinion: nil, nil. Anything but one JSON object is an error (the
// hook failed). Inside the object the original's narrowing applies: fields
// of the wrong type and decisions the point does not know are dropped,
// output keeps its scalar values only.
func ParseAnswer(point string, b []byte) (*Answer, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) > maxAnswer {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrAnswer, maxAnswer)
	}
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("%w: not UTF-8", ErrAnswer)
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil || raw == nil {
		return nil, fmt.Errorf("%w: not a JSON object: %s", ErrAnswer, clip(string(b), 200))
	}
	if len(bytes.TrimSpace(b[dec.InputOffset():])) > 0 {
		return nil, fmt.Errorf("%w: more than one JSON value: %s", ErrAnswer, clip(string(b), 200))
	}
	a := &Answer{}
	str := func(key string) string {
		var s string
		if v, ok := raw[key]; ok {
			_ = json.Unmarshal(v, &s) // another type reads as absent
		}
		return s
	}
	d := str("decision")
	switch point {
	case omni.HookStop:
		if d == omni.DecisionContinue || d == omni.DecisionStop {
			a.Decision = d
		}
		a.Input = str("input")
	default:
		if d == omni.DecisionAllow || d == omni.DecisionDeny {
			a.Decision = d
		}
		if point == omni.HookUserPrompt {
			a.Context = str("context")
		}
	}
	a.Reason = str("reason")
	if v, ok := raw["output"]; ok {
		var o map[string]any
		od := json.NewDecoder(bytes.NewReader(v))
		od.UseNumber()
		if od.Decode(&o) == nil && o != nil {
			a.Output = map[string]any{}
			for k, x := range o {
				switch x.(type) {
				case string, bool, json.Number:
					a.Output[k] = x
				}
			}
		}
	}
	return a, nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
