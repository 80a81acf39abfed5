package scripted

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"floe.dev/pkg/omni"
)

// DefaultContextWindow is the context window of a script that sets none.
const DefaultContextWindow = 128000

// defaultFinalText is the text of after_last "final_text" without final_text.
const defaultFinalText = "Done."

// after_last modes.
const (
	afterFail       = "fail"
	afterRepeatLast = "repeat_last"
	afterFinalText  = "final_text"
)

// script is a parsed, validated script file.
type script struct {
	contextWindow int64
	requests      []*entry
	afterLast     string
	finalText     string
	title         string // the answer to a title request; "": none
}

// entry is one request of a script: what to check, what to stream, what to
// report.
type entry struct {
	path       string // "requests[i]", for messages; "" for synthesized entries
	steps      []step
	usage      *omni.Usage // nil: estimate
	stopReason string

	expectLastUser    *string
	expectToolOutputs []string
	hasExpectOutputs  bool
}

type stepKind int

const (
	stepDelay stepKind = iota
	stepThinking
	stepText
	stepToolCall
	stepParallel
	stepError
)

var stepKindNames = map[string]stepKind{
	"thinking":            stepThinking,
	"text":                stepText,
	"tool_call":           stepToolCall,
	"parallel_tool_calls": stepParallel,
	"error":               stepError,
}

func (k stepKind) String() string {
	switch k {
	case stepThinking:
		return "thinking"
	case stepText:
		return "text"
	case stepToolCall:
		return "tool_call"
	case stepParallel:
		return "parallel_tool_calls"
	case stepError:
		return "error"
	}
	return "delay_ms"
}

// step is one step of a request entry.
type step struct {
	kind       stepKind
	content    string        // thinking, text
	chunks     int           // thinking, text; 0 = default fragments
	delay      time.Duration // before each delta; for delay and error steps, once
	fidelity   json.RawMessage
	open       bool   // "end": false
	calls      []call // tool_call (one), parallel_tool_calls
	interleave bool
	err        modelError
}

// call is one scripted tool call.
type call struct {
	name     string
	id       string
	args     string
	chunks   int
	delay    time.Duration
	fidelity json.RawMessage
}

// modelError is the *model.Error an error step fails with.
type modelError struct {
	status     string
	message    string
	httpStatus int
}

// ScriptError is a malformed script: Name is the script's name (its path for
// a file), Line the 1-based line of the offending value (0 when unknown),
// Field its path in the document ("requests[2].steps[0]"), Msg what is wrong.
type ScriptError struct {
	Name  string
	Line  int
	Field string
	Msg   string
}

func (e *ScriptError) Error() string {
	var b strings.Builder
	b.WriteString(e.Name)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Msg)
	return b.String()
}

// node is a JSON value of the script and its byte offset in the file.
type node struct {
	raw json.RawMessage
	off int
}

// member is one field of a JSON object.
type member struct {
	key string
	val node
}

// parser walks a script keeping byte offsets, so errors can name lines.
type parser struct {
	name string
	data []byte
}

// parseScript parses and validates data.
func parseScript(name string, data []byte) (*script, error) {
	p := &parser{name: name, data: data}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		// The decoder's message may quote the offending byte: say only
		// where, never what, since a script path may name any file.
		se := &ScriptError{Name: name, Msg: "invalid JSON"}
		if err.Error() == "unexpected end of JSON input" {
			se.Msg += ": unexpected end of input"
		}
		if syn, ok := errors.AsType[*json.SyntaxError](err); ok {
			se.Line = p.line(int(syn.Offset) - 1)
		}
		return nil, se
	}
	start := skipSpace(data, 0)
	return p.script(node{raw: data[start:], off: start})
}

// line returns the 1-based line holding byte offset off.
func (p *parser) line(off int) int {
	off = min(max(off, 0), len(p.data))
	return 1 + bytes.Count(p.data[:off], []byte{'\n'})
}

func (p *parser) errorf(n node, field, format string, args ...any) error {
	return &ScriptError{Name: p.name, Line: p.line(n.off), Field: field, Msg: fmt.Sprintf(format, args...)}
}

// skipSpace returns the offset of the next value in b at or after i,
// skipping white space and the separators a json.Decoder leaves unread.
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n', ':', ',':
			i++
		default:
			return i
		}
	}
	return i
}

// jsonKind names the JSON type of raw, for messages.
func jsonKind(raw []byte) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// object splits an object into its members, rejecting duplicate keys.
func (p *parser) object(n node, field string) ([]member, error) {
	if len(n.raw) == 0 || n.raw[0] != '{' {
		return nil, p.errorf(n, field, "want an object, got %s", jsonKind(n.raw))
	}
	dec := json.NewDecoder(bytes.NewReader(n.raw))
	if _, err := dec.Token(); err != nil {
		return nil, p.errorf(n, field, "%v", err)
	}
	var out []member
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, p.errorf(n, field, "%v", err)
		}
		key, _ := tok.(string)
		off := skipSpace(n.raw, int(dec.InputOffset()))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, p.errorf(n, field, "%v", err)
		}
		m := member{key: key, val: node{raw: raw, off: n.off + off}}
		if seen[key] {
			return nil, p.errorf(m.val, field, "duplicate field %q", key)
		}
		seen[key] = true
		out = append(out, m)
	}
	return out, nil
}

// array splits an array into its elements.
func (p *parser) array(n node, field string) ([]node, error) {
	if len(n.raw) == 0 || n.raw[0] != '[' {
		return nil, p.errorf(n, field, "want an array, got %s", jsonKind(n.raw))
	}
	dec := json.NewDecoder(bytes.NewReader(n.raw))
	if _, err := dec.Token(); err != nil {
		return nil, p.errorf(n, field, "%v", err)
	}
	var out []node
	for dec.More() {
		off := skipSpace(n.raw, int(dec.InputOffset()))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, p.errorf(n, field, "%v", err)
		}
		out = append(out, node{raw: raw, off: n.off + off})
	}
	return out, nil
}

func (p *parser) str(n node, field string) (string, error) {
	var s string
	if len(n.raw) == 0 || n.raw[0] != '"' || json.Unmarshal(n.raw, &s) != nil {
		return "", p.errorf(n, field, "want a string, got %s", jsonKind(n.raw))
	}
	return s, nil
}

func (p *parser) boolean(n node, field string) (bool, error) {
	var b bool
	if len(n.raw) == 0 || (n.raw[0] != 't' && n.raw[0] != 'f') || json.Unmarshal(n.raw, &b) != nil {
		return false, p.errorf(n, field, "want true or false, got %s", jsonKind(n.raw))
	}
	return b, nil
}

// integer reads an integer >= lo.
func (p *parser) integer(n node, field string, lo int64) (int64, error) {
	var v int64
	if jsonKind(n.raw) != "a number" {
		return 0, p.errorf(n, field, "want an integer, got %s", jsonKind(n.raw))
	}
	if err := json.Unmarshal(n.raw, &v); err != nil {
		return 0, p.errorf(n, field, "want an integer, got %s", n.raw)
	}
	if v < lo {
		return 0, p.errorf(n, field, "must be >= %d, got %d", lo, v)
	}
	return v, nil
}

// delay reads a delay_ms value.
func (p *parser) delay(n node, field string) (time.Duration, error) {
	ms, err := p.integer(n, field, 0)
	if err != nil {
		return 0, err
	}
	const maxMs = int64(24 * time.Hour / time.Millisecond)
	if ms > maxMs {
		return 0, p.errorf(n, field, "must be <= %d (a day), got %d", maxMs, ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// fidelity reads a fidelity object, compacted so it stays single-line JSON.
func (p *parser) fidelity(n node, field string) (json.RawMessage, error) {
	if len(n.raw) == 0 || n.raw[0] != '{' {
		return nil, p.errorf(n, field, "want an object, got %s", jsonKind(n.raw))
	}
	var b bytes.Buffer
	if err := json.Compact(&b, n.raw); err != nil {
		return nil, p.errorf(n, field, "%v", err)
	}
	return json.RawMessage(b.Bytes()), nil
}

// status reads one of the statuses in allowed.
func (p *parser) status(n node, field string, allowed ...string) (string, error) {
	s, err := p.str(n, field)
	if err != nil {
		return "", err
	}
	for _, a := range allowed {
		if s == a {
			return s, nil
		}
	}
	return "", p.errorf(n, field, "unknown status %q (want one of %s)", s, strings.Join(allowed, ", "))
}

func (p *parser) script(n node) (*script, error) {
	members, err := p.object(n, "")
	if err != nil {
		return nil, err
	}
	s := &script{contextWindow: DefaultContextWindow, afterLast: afterFail, finalText: defaultFinalText}
	var haveRequests bool
	var finalText *member
	for _, m := range members {
		switch m.key {
		case "context_window":
			if s.contextWindow, err = p.integer(m.val, m.key, 1); err != nil {
				return nil, err
			}
		case "requests":
			haveRequests = true
			elems, err := p.array(m.val, m.key)
			if err != nil {
				return nil, err
			}
			for i, e := range elems {
				r, err := p.entry(e, fmt.Sprintf("requests[%d]", i))
				if err != nil {
					return nil, err
				}
				s.requests = append(s.requests, r)
			}
		case "after_last":
			a, err := p.str(m.val, m.key)
			if err != nil {
				return nil, err
			}
			switch a {
			case afterFail, afterRepeatLast, afterFinalText:
				s.afterLast = a
			default:
				return nil, p.errorf(m.val, m.key, "unknown mode %q (want fail, repeat_last or final_text)", a)
			}
		case "title":
			if s.title, err = p.str(m.val, m.key); err != nil {
				return nil, err
			}
		case "final_text":
			if s.finalText, err = p.str(m.val, m.key); err != nil {
				return nil, err
			}
			finalText = &m
		default:
			return nil, p.errorf(m.val, "", "unknown field %q (want context_window, requests, after_last, final_text, title)", m.key)
		}
	}
	if !haveRequests {
		return nil, p.errorf(n, "", `missing field "requests"`)
	}
	if finalText != nil && s.afterLast != afterFinalText {
		return nil, p.errorf(finalText.val, "final_text", `only allowed with "after_last": "final_text"`)
	}
	if s.afterLast == afterRepeatLast && len(s.requests) == 0 {
		return nil, p.errorf(n, "after_last", "repeat_last needs at least one request")
	}
	return s, nil
}

func (p *parser) entry(n node, field string) (*entry, error) {
	members, err := p.object(n, field)
	if err != nil {
		return nil, err
	}
	r := &entry{path: field, stopReason: omni.StatusCompleted}
	var stepNodes []node
	for _, m := range members {
		sub := field + "." + m.key
		switch m.key {
		case "steps":
			elems, err := p.array(m.val, sub)
			if err != nil {
				return nil, err
			}
			stepNodes = elems
			for i, e := range elems {
				st, err := p.step(e, fmt.Sprintf("%s[%d]", sub, i))
				if err != nil {
					return nil, err
				}
				r.steps = append(r.steps, st)
			}
		case "usage":
			if r.usage, err = p.usage(m.val, sub); err != nil {
				return nil, err
			}
		case "stop_reason":
			if r.stopReason, err = p.status(m.val, sub, omni.StatusCompleted, omni.StatusFailed,
				omni.StatusAborted, omni.StatusTimeout, omni.StatusMalformed, omni.StatusAuth); err != nil {
				return nil, err
			}
		case "expect_last_user":
			s, err := p.str(m.val, sub)
			if err != nil {
				return nil, err
			}
			r.expectLastUser = &s
		case "expect_tool_outputs":
			elems, err := p.array(m.val, sub)
			if err != nil {
				return nil, err
			}
			r.hasExpectOutputs = true
			r.expectToolOutputs = []string{}
			for i, e := range elems {
				id, err := p.str(e, fmt.Sprintf("%s[%d]", sub, i))
				if err != nil {
					return nil, err
				}
				r.expectToolOutputs = append(r.expectToolOutputs, id)
			}
		default:
			return nil, p.errorf(m.val, field, "unknown field %q (want steps, usage, stop_reason, expect_last_user, expect_tool_outputs)", m.key)
		}
	}
	// An open block must be failed by a later error step.
	for i, st := range r.steps {
		if !st.open {
			continue
		}
		failed := false
		for _, later := range r.steps[i+1:] {
			failed = failed || later.kind == stepError
		}
		if !failed {
			return nil, p.errorf(stepNodes[i], fmt.Sprintf("%s.steps[%d]", field, i),
				`"end": false needs a later error step in the same request`)
		}
	}
	return r, nil
}

func (p *parser) usage(n node, field string) (*omni.Usage, error) {
	members, err := p.object(n, field)
	if err != nil {
		return nil, err
	}
	u := &omni.Usage{}
	for _, m := range members {
		var dst *int64
		switch m.key {
		case "cache_read":
			dst = &u.CacheRead
		case "cache_write":
			dst = &u.CacheWrite
		case "output":
			dst = &u.Output
		case "total":
			dst = &u.Total
		default:
			return nil, p.errorf(m.val, field, "unknown field %q (want cache_read, cache_write, output, total)", m.key)
		}
		if *dst, err = p.integer(m.val, field+"."+m.key, 0); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// Which modifiers each step kind accepts.
var stepModifiers = map[stepKind][]string{
	stepDelay:    {"delay_ms"},
	stepThinking: {"chunks", "delay_ms", "fidelity", "end"},
	stepText:     {"chunks", "delay_ms", "fidelity", "end"},
	stepToolCall: {"chunks", "delay_ms", "fidelity", "end"},
	stepParallel: {"chunks", "delay_ms", "end", "interleave"},
	stepError:    {"delay_ms"},
}

func (p *parser) step(n node, field string) (step, error) {
	var st step
	members, err := p.object(n, field)
	if err != nil {
		return st, err
	}
	// Find the kind first, so that modifiers can be checked against it.
	var kind *member
	for i, m := range members {
		if _, ok := stepKindNames[m.key]; !ok {
			continue
		}
		if kind != nil {
			return st, p.errorf(m.val, field, "a step has one kind, got both %q and %q", kind.key, m.key)
		}
		kind = &members[i]
	}
	st.kind = stepDelay
	if kind != nil {
		st.kind = stepKindNames[kind.key]
	}
	allowed := stepModifiers[st.kind]
	mods := map[string]node{}
	for _, m := range members {
		if kind != nil && m.key == kind.key {
			continue
		}
		if !isModifier(m.key) {
			if kind == nil {
				return st, p.errorf(n, field, "unknown step kind %q (want thinking, text, tool_call, parallel_tool_calls, error or delay_ms)", m.key)
			}
			return st, p.errorf(m.val, field, "unknown field %q in a %s step", m.key, kind.key)
		}
		if !slices.Contains(allowed, m.key) {
			return st, p.errorf(m.val, field, "%q is not allowed on a %s step", m.key, st.kind)
		}
		mods[m.key] = m.val
	}
	if kind == nil && len(mods) == 0 {
		return st, p.errorf(n, field, "empty step (want one of thinking, text, tool_call, parallel_tool_calls, error, delay_ms)")
	}

	if v, ok := mods["delay_ms"]; ok {
		if st.delay, err = p.delay(v, field+".delay_ms"); err != nil {
			return st, err
		}
	}
	if v, ok := mods["chunks"]; ok {
		c, err := p.integer(v, field+".chunks", 0)
		if err != nil {
			return st, err
		}
		st.chunks = int(min(c, 1<<20))
	}
	if v, ok := mods["fidelity"]; ok {
		if st.fidelity, err = p.fidelity(v, field+".fidelity"); err != nil {
			return st, err
		}
	}
	if v, ok := mods["end"]; ok {
		end, err := p.boolean(v, field+".end")
		if err != nil {
			return st, err
		}
		st.open = !end
	}
	if v, ok := mods["interleave"]; ok {
		if st.interleave, err = p.boolean(v, field+".interleave"); err != nil {
			return st, err
		}
	}
	if kind == nil {
		return st, nil
	}

	sub := field + "." + kind.key
	switch st.kind {
	case stepThinking, stepText:
		st.content, err = p.str(kind.val, sub)
	case stepToolCall:
		var c call
		c, err = p.call(kind.val, sub, st, mods)
		st.calls = []call{c}
		st.chunks, st.delay, st.fidelity = 0, 0, nil // moved into the call
	case stepParallel:
		var elems []node
		if elems, err = p.array(kind.val, sub); err != nil {
			return st, err
		}
		if len(elems) == 0 {
			return st, p.errorf(kind.val, sub, "want at least one tool call")
		}
		for i, e := range elems {
			c, err := p.call(e, fmt.Sprintf("%s[%d]", sub, i), st, nil)
			if err != nil {
				return st, err
			}
			st.calls = append(st.calls, c)
		}
		st.chunks, st.delay = 0, 0 // moved into the calls
	case stepError:
		st.err, err = p.modelError(kind.val, sub)
	}
	return st, err
}

func isModifier(key string) bool {
	switch key {
	case "chunks", "delay_ms", "fidelity", "end", "interleave":
		return true
	}
	return false
}

// call reads a CALL object. st holds the step's modifiers, used as defaults;
// stepMods, when non-nil, are the modifiers written on a tool_call step,
// which may not be repeated inside the call.
func (p *parser) call(n node, field string, st step, stepMods map[string]node) (call, error) {
	c := call{chunks: st.chunks, delay: st.delay, fidelity: st.fidelity}
	members, err := p.object(n, field)
	if err != nil {
		return c, err
	}
	var haveName, haveArgs bool
	for _, m := range members {
		sub := field + "." + m.key
		if _, twice := stepMods[m.key]; twice && m.key != "end" {
			return c, p.errorf(m.val, sub, "also set on the step; set it in one place")
		}
		switch m.key {
		case "name":
			if c.name, err = p.str(m.val, sub); err != nil {
				return c, err
			}
			if c.name == "" {
				return c, p.errorf(m.val, sub, "must not be empty")
			}
			haveName = true
		case "id":
			if c.id, err = p.str(m.val, sub); err != nil {
				return c, err
			}
		case "arguments", "arguments_raw":
			if haveArgs {
				return c, p.errorf(m.val, field, "set arguments or arguments_raw, not both")
			}
			haveArgs = true
			if m.key == "arguments_raw" {
				if c.args, err = p.str(m.val, sub); err != nil {
					return c, err
				}
				continue
			}
			var b bytes.Buffer
			if err := json.Compact(&b, m.val.raw); err != nil {
				return c, p.errorf(m.val, sub, "%v", err)
			}
			c.args = b.String()
		case "chunks":
			v, err := p.integer(m.val, sub, 0)
			if err != nil {
				return c, err
			}
			c.chunks = int(min(v, 1<<20))
		case "delay_ms":
			if c.delay, err = p.delay(m.val, sub); err != nil {
				return c, err
			}
		case "fidelity":
			if c.fidelity, err = p.fidelity(m.val, sub); err != nil {
				return c, err
			}
		default:
			return c, p.errorf(m.val, field, "unknown field %q in a tool call (want name, id, arguments, arguments_raw, chunks, delay_ms, fidelity)", m.key)
		}
	}
	if !haveName {
		return c, p.errorf(n, field, `tool call without "name"`)
	}
	if !haveArgs {
		c.args = "{}"
	}
	return c, nil
}

func (p *parser) modelError(n node, field string) (modelError, error) {
	var e modelError
	members, err := p.object(n, field)
	if err != nil {
		return e, err
	}
	for _, m := range members {
		sub := field + "." + m.key
		switch m.key {
		case "status":
			if e.status, err = p.status(m.val, sub, omni.StatusFailed, omni.StatusTimeout, omni.StatusMalformed, omni.StatusAuth); err != nil {
				return e, err
			}
		case "message":
			if e.message, err = p.str(m.val, sub); err != nil {
				return e, err
			}
		case "http_status":
			v, err := p.integer(m.val, sub, 0)
			if err != nil {
				return e, err
			}
			if v > 999 {
				return e, p.errorf(m.val, sub, "must be <= 999, got %d", v)
			}
			e.httpStatus = int(v)
		default:
			return e, p.errorf(m.val, field, "unknown field %q (want status, message, http_status)", m.key)
		}
	}
	if e.status == "" {
		return e, p.errorf(n, field, `missing field "status" (failed, timeout, malformed or auth)`)
	}
	if e.message == "" {
		e.message = "scripted " + e.status + " error"
	}
	return e, nil
}
