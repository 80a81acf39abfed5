package omni

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

// Hooks (protocol.md §7 "Hooks"): deployments intercept the loop at three points,
// as the original harness does since its 0.2.10. Every pre_tool_use and stop
// hook that answers leaves one hook event on the stream and in the Trace:
// {type: "hook", hook, name, decision?, reason?, output?}, exactly the
// original's record, plus tool_call_id for pre_tool_use (readers keep
// unknown fields).
const (
	TypeHook = "hook"

	HookUserPrompt = "user_prompt"
	HookPreToolUse = "pre_tool_use"
	HookStop       = "stop"

	// DecisionContinue and DecisionStop are a stop hook's decisions; a
	// pre_tool_use or user_prompt hook answers DecisionAllow or DecisionDeny.
	DecisionContinue = "continue"
	DecisionStop     = "stop"

	// SenderHarness marks a user text the harness wrote (a stop hook's
	// continue input, a user_prompt hook's context), as the original does.
	SenderHarness = "harness"
)

// HookRecord is the content of a hook event.
type HookRecord struct {
	Point    string // user_prompt | pre_tool_use | stop
	Name     string
	Decision string // allow | deny | continue | stop, or "" (no decision)
	Reason   string
	// Output is the hook's own structured record: scalars only (string,
	// float64, bool, json.Number), as the original keeps it.
	Output     map[string]any
	ToolCallID string // pre_tool_use only (Floe's addition)
}

// HookEvent builds the hook event of r, its fields in the original's order
// (type, hook, name, decision, reason, output) and tool_call_id last.
func HookEvent(r HookRecord) Message {
	p := Payload{Type: TypeHook, Name: r.Name, Decision: r.Decision, Reason: r.Reason, ToolCallID: r.ToolCallID}
	raw := &payloadRaw{}
	extra := func(key string, v any) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			panic("omni: encode hook " + key + ": " + err.Error()) // only plain data is passed
		}
		raw.order = append(raw.order, extraBase+fieldRef(len(raw.extra)))
		raw.extra = append(raw.extra, rawField{key: `"` + key + `"`, value: bytes.TrimSpace(buf.Bytes())})
	}
	known := func(name string) { raw.order = append(raw.order, fieldIndex[name]) }
	known("type")
	extra("hook", r.Point)
	known("name")
	if r.Decision != "" {
		known("decision")
	}
	if r.Reason != "" {
		known("reason")
	}
	if r.Output != nil {
		extra("output", scalarOutput(r.Output))
	}
	if r.ToolCallID != "" {
		known("tool_call_id")
	}
	p.raw = raw
	return Event(p)
}

// scalarOutput keeps the scalar values of o, as the original does with a
// hook's output; keys are encoded sorted (encoding/json's map order).
func scalarOutput(o map[string]any) map[string]any {
	out := make(map[string]any, len(o))
	for k, v := range o {
		switch v.(type) {
		case string, bool, float64, float32, int, int64, json.Number:
			out[k] = v
		}
	}
	return out
}

// Hook returns the record of a hook event (ok false for any other payload).
// A hook event written by the original keeps its output here as decoded
// JSON scalars; fields of the wrong type read as absent.
func (p *Payload) Hook() (r HookRecord, ok bool) {
	if p.Type != TypeHook {
		return HookRecord{}, false
	}
	r = HookRecord{Name: p.Name, Decision: p.Decision, Reason: p.Reason, ToolCallID: p.ToolCallID}
	if v := p.Field("hook"); v != nil {
		_ = json.Unmarshal(v, &r.Point) // a non-string point reads as ""
	}
	if v := p.Field("output"); v != nil {
		var o map[string]any
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.UseNumber()
		if dec.Decode(&o) == nil {
			r.Output = scalarOutput(o)
		}
	}
	if p.raw != nil {
		// A record whose known fields had another type (decoded
		// leniently, as an unknown type's are) keeps them as raw fields.
		for _, x := range p.raw.extra {
			var s string
			switch x.key {
			case `"name"`:
				if json.Unmarshal(x.value, &s) == nil {
					r.Name = s
				}
			case `"reason"`:
				if json.Unmarshal(x.value, &s) == nil {
					r.Reason = s
				}
			}
		}
	}
	return r, true
}

// Summary is one line for people: "pre_tool_use hook no-push: deny
// (pushes to main are not allowed)".
func (r HookRecord) Summary() string {
	s := r.Point + " hook " + r.Name
	if r.Decision != "" {
		s += ": " + r.Decision
	}
	if r.Reason != "" {
		s += " (" + r.Reason + ")"
	}
	if len(r.Output) > 0 {
		keys := make([]string, 0, len(r.Output))
		for k := range r.Output {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			s += fmt.Sprintf(" %s=%v", k, r.Output[k])
		}
	}
	return s
}

// DeniedByHook is the output of a tool call a pre_tool_use hook denied
// (protocol.md §7): "Tool call denied by the <name> hook: <reason>." (without a
// reason, "Tool call denied by the <name> hook.").
func DeniedByHook(name, reason string) string {
	if reason == "" {
		return "Tool call denied by the " + name + " hook."
	}
	return "Tool call denied by the " + name + " hook: " + reason + "."
}
