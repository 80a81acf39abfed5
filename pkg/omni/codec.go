package omni

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The JSON codec is hand-written for two reasons: payload fields must keep
// their decoded order and unknown fields must survive byte for byte (so a
// Trace from the original harness re-encodes identically), and partials are
// the hottest thing Floe encodes. Output is single-line JSON with no HTML
// escaping, like JavaScript's JSON.stringify.

type fieldKind uint8

const (
	kString fieldKind = iota
	kInt
	kRaw
	kUsage
)

type fieldDef struct {
	name  string
	kind  fieldKind
	slot  int // kUsage: index into Payload.usage
	str   func(*Payload) *string
	num   func(*Payload) *int64
	raw   func(*Payload) *json.RawMessage
	usage func(*Payload) **Usage
}

func sf(name string, f func(*Payload) *string) fieldDef {
	return fieldDef{name: name, kind: kString, str: f}
}

func nf(name string, f func(*Payload) *int64) fieldDef {
	return fieldDef{name: name, kind: kInt, num: f}
}

func rf(name string, f func(*Payload) *json.RawMessage) fieldDef {
	return fieldDef{name: name, kind: kRaw, raw: f}
}

func uf(name string, slot int, f func(*Payload) **Usage) fieldDef {
	return fieldDef{name: name, kind: kUsage, slot: slot, usage: f}
}

// fields lists every known payload field in canonical encoding order.
var fields = [...]fieldDef{
	sf("type", func(p *Payload) *string { return &p.Type }),
	sf("role", func(p *Payload) *string { return &p.Role }),
	sf("name", func(p *Payload) *string { return &p.Name }),
	sf("arguments", func(p *Payload) *string { return &p.Arguments }),
	sf("output", func(p *Payload) *string { return &p.Output }),
	rf("images", func(p *Payload) *json.RawMessage { return &p.Images }),
	sf("text", func(p *Payload) *string { return &p.Text }),
	sf("thinking", func(p *Payload) *string { return &p.Thinking }),
	sf("sender", func(p *Payload) *string { return &p.Sender }),
	sf("image_url", func(p *Payload) *string { return &p.ImageURL }),
	sf("data", func(p *Payload) *string { return &p.Data }),
	sf("mime_type", func(p *Payload) *string { return &p.MimeType }),
	sf("tool_call_id", func(p *Payload) *string { return &p.ToolCallID }),
	sf("event_type", func(p *Payload) *string { return &p.EventType }),
	sf("stop_reason", func(p *Payload) *string { return &p.StopReason }),
	rf("fidelity", func(p *Payload) *json.RawMessage { return &p.Fidelity }),
	sf("session_id", func(p *Payload) *string { return &p.SessionID }),
	sf("provider", func(p *Payload) *string { return &p.Provider }),
	sf("model_id", func(p *Payload) *string { return &p.ModelID }),
	nf("model_context_window", func(p *Payload) *int64 { return &p.ModelContextWindow }),
	sf("system_prompt", func(p *Payload) *string { return &p.SystemPrompt }),
	sf("workspace", func(p *Payload) *string { return &p.Workspace }),
	sf("source", func(p *Payload) *string { return &p.Source }),
	sf("agent_state", func(p *Payload) *string { return &p.AgentState }),
	rf("tools", func(p *Payload) *json.RawMessage { return &p.Tools }),
	sf("status", func(p *Payload) *string { return &p.Status }),
	sf("error_message", func(p *Payload) *string { return &p.ErrorMessage }),
	nf("attempt", func(p *Payload) *int64 { return &p.Attempt }),
	nf("retry_in_ms", func(p *Payload) *int64 { return &p.RetryInMs }),
	sf("decision", func(p *Payload) *string { return &p.Decision }),
	uf("session", 0, func(p *Payload) **Usage { return &p.Session }),
	uf("request", 1, func(p *Payload) **Usage { return &p.Request }),
	sf("reason", func(p *Payload) *string { return &p.Reason }),
	sf("mode", func(p *Payload) *string { return &p.Mode }),
	nf("context", func(p *Payload) *int64 { return &p.Context }),
	nf("turns", func(p *Payload) *int64 { return &p.Turns }),
}

// idxWindow is model_context_window's index: an integer, or the string
// "unknown" (Payload.ContextWindowUnknown).
var idxWindow = int(fieldIndex["model_context_window"])

var fieldIndex = func() map[string]fieldRef {
	m := make(map[string]fieldRef, len(fields))
	for i, f := range fields {
		m[f.name] = fieldRef(i)
	}
	return m
}()

type fieldSet uint64

// decodedInOrder, in Payload.present, says that the payload was decoded with its
// known fields in canonical order and nothing else: they are written
// first, in that order, with no order kept (payloadRaw.order).
const decodedInOrder fieldSet = 1 << 63

// fieldRef names one decoded field: an index into fields (payload) or one of
// the env* constants (envelope), or extraBase+i for the i-th unknown field.
type fieldRef uint32

// extraBase marks a fieldRef that indexes Payload.extra or Message.extra. It
// leaves room for any number of unknown fields a line can hold.
const extraBase fieldRef = 1 << 31

// Envelope keys, in canonical order.
const (
	envTimestamp fieldRef = iota
	envType
	envPayload
	envOrigin
	numEnv
)

type rawField struct {
	key   string // the raw quoted key, as it appeared
	value []byte // the raw value
}

func (p *Payload) isSet(i int) bool {
	if p.present&(1<<uint(i)) != 0 {
		return true
	}
	f := &fields[i]
	switch f.kind {
	case kString:
		return *f.str(p) != ""
	case kInt:
		return *f.num(p) != 0 || (i == idxWindow && p.ContextWindowUnknown)
	case kRaw:
		return len(*f.raw(p)) != 0
	default:
		return *f.usage(p) != nil
	}
}

// Marshal encodes m as single-line JSON.
func Marshal(m *Message) ([]byte, error) {
	if err := m.checkRaw(); err != nil {
		return nil, err
	}
	return m.AppendJSON(make([]byte, 0, m.sizeHint())), nil
}

// sizeHint guesses the encoded length of m, so that Marshal allocates once
// for most messages: the fixed part, the large fields and room for escapes.
func (m *Message) sizeHint() int {
	p := &m.Payload
	n := len(p.Content()) + len(p.Fidelity) + len(p.Images) + len(p.Tools) + len(p.SystemPrompt) + len(p.Data)
	return 256 + n + n/8
}

// MustMarshal is Marshal for messages built by this package's builders, whose
// raw fields are valid by construction; it panics on invalid raw JSON.
func MustMarshal(m *Message) []byte {
	b, err := Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func (m *Message) checkRaw() error {
	p := &m.Payload
	for i := range fields {
		f := &fields[i]
		if f.kind == kRaw {
			if r := *f.raw(p); len(r) > 0 && !json.Valid(r) {
				return fmt.Errorf("omni: encode %s: field %q is not valid JSON", p.Type, f.name)
			}
		}
	}
	return nil
}

// AppendJSON appends the single-line JSON encoding of m to dst. Raw fields
// (fidelity, images, tools, unknown fields) are written as they are, minus
// any CR or LF (in valid JSON those can only be whitespace): they must hold
// valid JSON, which Marshal checks and decoding guarantees.
func (m *Message) AppendJSON(dst []byte) []byte {
	dst = append(dst, '{')
	var written uint8
	first := true
	var order []fieldRef
	if m.env != nil {
		order = m.env.order
	}
	for _, ref := range order {
		if ref >= extraBase {
			dst = appendRawField(dst, m.env.extra[ref-extraBase], first)
			first = false
			continue
		}
		if written&(1<<ref) != 0 {
			continue
		}
		written |= 1 << ref
		if m.hasEnv(ref) {
			dst = m.appendEnv(dst, ref, first)
			first = false
		}
	}
	for ref := envTimestamp; ref < numEnv; ref++ {
		if written&(1<<ref) == 0 && m.hasEnv(ref) {
			dst = m.appendEnv(dst, ref, first)
			first = false
		}
	}
	return append(dst, '}')
}

// hasEnv reports whether the envelope key ref is written: timestamp, type and
// payload always are; origin when it has hops or was decoded null or empty.
func (m *Message) hasEnv(ref fieldRef) bool {
	return ref != envOrigin || len(m.Origin) > 0 || m.env != nil && m.env.originRaw != nil
}

func (m *Message) appendEnv(dst []byte, ref fieldRef, first bool) []byte {
	if !first {
		dst = append(dst, ',')
	}
	switch ref {
	case envTimestamp:
		dst = append(dst, `"timestamp":`...)
		dst = appendString(dst, m.Timestamp)
	case envType:
		dst = append(dst, `"type":`...)
		dst = appendString(dst, string(m.Type))
	case envPayload:
		dst = append(dst, `"payload":`...)
		dst = m.Payload.appendJSON(dst)
	case envOrigin:
		dst = append(dst, `"origin":`...)
		if len(m.Origin) == 0 {
			return appendRaw(dst, m.env.originRaw)
		}
		dst = append(dst, '[')
		for i, o := range m.Origin {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, o)
		}
		dst = append(dst, ']')
	}
	return dst
}

func appendRawField(dst []byte, x rawField, first bool) []byte {
	if !first {
		dst = append(dst, ',')
	}
	dst = append(dst, x.key...)
	dst = append(dst, ':')
	return appendRaw(dst, x.value)
}

// appendRaw appends the valid JSON value r without CR and LF, so that the
// encoding stays on one line: outside strings they are only whitespace, and
// inside strings valid JSON has them escaped.
func appendRaw(dst, r []byte) []byte {
	for len(r) > 0 {
		i := bytes.IndexAny(r, "\r\n")
		if i < 0 {
			return append(dst, r...)
		}
		dst = append(dst, r[:i]...)
		r = r[i+1:]
	}
	return dst
}

func (p *Payload) appendJSON(dst []byte) []byte {
	dst = append(dst, '{')
	first := true
	var written fieldSet
	// A decoded field as it was decoded: its value (or null).
	decoded := func(i int) {
		bit := fieldSet(1) << i
		if written&bit != 0 {
			return
		}
		switch {
		case p.isSet(i):
			dst = p.appendField(dst, i, first)
		case p.nulls&bit != 0:
			dst = appendNull(dst, i, first)
		default:
			return
		}
		written |= bit
		first = false
	}
	switch {
	case p.raw != nil && p.raw.order != nil:
		for _, ref := range p.raw.order {
			if ref >= extraBase {
				dst = appendRawField(dst, p.raw.extra[ref-extraBase], first)
				first = false
				continue
			}
			decoded(int(ref))
		}
	case p.present&decodedInOrder != 0:
		for i := range fields {
			if (p.present|p.nulls)&(1<<uint(i)) != 0 {
				decoded(i)
			}
		}
	}
	for i := range fields {
		if written&(1<<uint(i)) != 0 || !p.isSet(i) {
			continue
		}
		dst = p.appendField(dst, i, first)
		first = false
	}
	return append(dst, '}')
}

func appendNull(dst []byte, i int, first bool) []byte {
	if !first {
		dst = append(dst, ',')
	}
	dst = append(dst, '"')
	dst = append(dst, fields[i].name...)
	return append(dst, `":null`...)
}

func (p *Payload) appendField(dst []byte, i int, first bool) []byte {
	f := &fields[i]
	if !first {
		dst = append(dst, ',')
	}
	dst = append(dst, '"')
	dst = append(dst, f.name...)
	dst = append(dst, '"', ':')
	switch f.kind {
	case kString:
		dst = appendString(dst, *f.str(p))
	case kInt:
		if i == idxWindow && p.ContextWindowUnknown {
			dst = append(dst, `"unknown"`...)
			break
		}
		dst = strconv.AppendInt(dst, *f.num(p), 10)
	case kRaw:
		r := *f.raw(p)
		if len(r) == 0 {
			r = []byte("null")
		}
		dst = appendRaw(dst, r)
	case kUsage:
		u := *f.usage(p)
		switch {
		case u == nil:
			dst = append(dst, "null"...)
		case p.raw != nil && p.raw.usage[f.slot].raw != nil && *u == p.raw.usage[f.slot].val:
			dst = appendRaw(dst, p.raw.usage[f.slot].raw)
		default:
			dst = appendUsage(dst, u)
		}
	}
	return dst
}

func appendUsage(dst []byte, u *Usage) []byte {
	dst = append(dst, `{"cache_read":`...)
	dst = strconv.AppendInt(dst, u.CacheRead, 10)
	dst = append(dst, `,"cache_write":`...)
	dst = strconv.AppendInt(dst, u.CacheWrite, 10)
	dst = append(dst, `,"output":`...)
	dst = strconv.AppendInt(dst, u.Output, 10)
	dst = append(dst, `,"total":`...)
	dst = strconv.AppendInt(dst, u.Total, 10)
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string: ", \ and control characters are
// escaped, invalid UTF-8 becomes U+FFFD, everything else is written as is.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Decoding.

// ErrSyntax is wrapped by every decoding error caused by malformed JSON.
var ErrSyntax = errors.New("omni: malformed JSON")

// Unmarshal decodes one envelope from b. It checks structure and field types;
// Validate checks meaning. Unknown envelope and payload fields are kept, and
// the key order of both is remembered for encoding. A known key that appears
// twice is an error, as is anything after the object but whitespace.
func Unmarshal(b []byte, m *Message) error {
	*m = Message{}
	var (
		seen     uint8
		orderBuf [numEnv]fieldRef
		order    = orderBuf[:0]
		env      envRaw
		inOrder  = true // known keys only, each after the one before
	)
	i := skipWS(b, 0)
	end, err := scanMembers(b, i, 0, func(key []byte, at int) (int, error) {
		ref := envRef(key)
		if ref == extraBase {
			end, err := skipValue(b, at, 1)
			if err != nil {
				return 0, err
			}
			order = append(order, extraBase+fieldRef(len(env.extra)))
			env.extra = append(env.extra, rawField{key: string(key), value: append([]byte(nil), b[at:end]...)})
			inOrder = false
			return end, nil
		}
		if seen&(1<<ref) != 0 {
			return 0, fmt.Errorf("%w: duplicate envelope field %s", ErrSyntax, key)
		}
		if seen >= 1<<ref {
			inOrder = false
		}
		seen |= 1 << ref
		order = append(order, ref)
		if ref == envPayload {
			// The payload, most of the bytes, is read once: decoded as
			// it is scanned.
			return m.decodePayload(b, at)
		}
		end, err := skipValue(b, at, 1)
		if err != nil {
			return 0, err
		}
		val := b[at:end]
		switch ref {
		case envTimestamp:
			return end, decodeStringInto(val, &m.Timestamp, "timestamp")
		case envType:
			var t string
			err := decodeStringInto(val, &t, "type")
			m.Type = Kind(t)
			return end, err
		default:
			if err := decodeOrigin(val, &m.Origin); err != nil {
				return 0, err
			}
			if len(m.Origin) == 0 {
				m.Origin = nil
				env.originRaw = append([]byte(nil), val...)
			}
			return end, nil
		}
	})
	if err != nil {
		return err
	}
	if skipWS(b, end) != len(b) {
		return fmt.Errorf("%w: trailing data after message", ErrSyntax)
	}
	if !inOrder {
		env.order = slices.Clone(order)
	}
	if env.order != nil || env.extra != nil || env.originRaw != nil {
		m.env = new(env)
	}
	return nil
}

// decodePayload decodes the envelope's payload value at b[at], as an
// envelope member (nesting depth 1), and returns the index after it.
func (m *Message) decodePayload(b []byte, at int) (int, error) {
	if at < len(b) && b[at] != '{' {
		if _, err := skipValue(b, at, 1); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: payload is not an object", ErrSyntax)
	}
	end, err := m.Payload.decode(b, at, false)
	if err == nil || errors.Is(err, ErrSyntax) {
		return end, err
	}
	// A payload type Floe does not know (the original's goal_finished, …)
	// may use a known field name for a value of another type: keep such a
	// field as an unknown one, byte for byte, rather than fail the record.
	var lp Payload
	end, lerr := lp.decode(b, at, true)
	if lerr == nil && lp.Type != "" && !knownTypes[lp.Type] {
		m.Payload = lp
		return end, nil
	}
	if lerr != nil && errors.Is(lerr, ErrSyntax) {
		// Malformed later on: report that, as a scan of the whole value
		// would have first.
		return 0, lerr
	}
	return 0, err
}

// envRef maps a raw quoted envelope key to its env* constant, or extraBase
// for an unknown key.
func envRef(key []byte) fieldRef {
	inner := key[1 : len(key)-1]
	if bytes.IndexByte(inner, '\\') >= 0 {
		inner = []byte(unescapeKey(key))
	}
	switch string(inner) {
	case "timestamp":
		return envTimestamp
	case "type":
		return envType
	case "payload":
		return envPayload
	case "origin":
		return envOrigin
	}
	return extraBase
}

// Decode is Unmarshal followed by Validate.
func Decode(b []byte) (Message, error) {
	var m Message
	if err := Unmarshal(b, &m); err != nil {
		return m, err
	}
	return m, m.Validate()
}

func decodeOrigin(val []byte, out *[]string) error {
	if string(val) == "null" {
		return nil
	}
	if val[0] != '[' {
		return fmt.Errorf("%w: origin is not an array", ErrSyntax)
	}
	i := skipWS(val, 1)
	if i < len(val) && val[i] == ']' {
		return nil
	}
	for {
		end, err := skipValue(val, i, 0)
		if err != nil {
			return err
		}
		var s string
		if err := decodeStringInto(val[i:end], &s, "origin"); err != nil {
			return err
		}
		*out = append(*out, s)
		i = skipWS(val, end)
		if i >= len(val) {
			return fmt.Errorf("%w: unterminated origin", ErrSyntax)
		}
		if val[i] == ']' {
			return nil
		}
		if val[i] != ',' {
			return fmt.Errorf("%w: origin: expected , or ]", ErrSyntax)
		}
		i = skipWS(val, i+1)
	}
}

// decode decodes the payload object at b[at], a member of an envelope
// (nesting depth 1), and returns the index after it. lenient keeps a known
// field whose value has the wrong JSON type as an unknown field instead of
// failing.
func (p *Payload) decode(b []byte, at int, lenient bool) (int, error) {
	var (
		orderBuf [16]fieldRef
		order    = orderBuf[:0]
		raw      payloadRaw
		usageRaw bool
		inOrder  = true // known fields only, each after the one before
		last     = -1
	)
	end, err := scanObjectDepth(b, at, 1, func(key, val []byte) error {
		ref, known := payloadRef(key)
		if known && lenient && !fitsKind(fields[ref].kind, val) {
			known = false
		}
		if !known {
			order = append(order, extraBase+fieldRef(len(raw.extra)))
			raw.extra = append(raw.extra, rawField{key: string(key), value: append([]byte(nil), val...)})
			inOrder = false
			return nil
		}
		i := int(ref)
		f := &fields[i]
		bit := fieldSet(1) << i
		if (p.present|p.nulls)&bit != 0 {
			return fmt.Errorf("%w: duplicate field %q", ErrSyntax, f.name)
		}
		order = append(order, ref)
		if i < last {
			inOrder = false
		}
		last = i
		if string(val) == "null" {
			p.nulls |= bit
			return nil
		}
		switch f.kind {
		case kString:
			if err := decodeStringInto(val, f.str(p), f.name); err != nil {
				return err
			}
		case kInt:
			if i == idxWindow && string(val) == `"unknown"` {
				p.ContextWindowUnknown = true
				break
			}
			n, err := parseInt(val)
			if err != nil {
				return fmt.Errorf("omni: field %q: %w", f.name, err)
			}
			*f.num(p) = n
		case kRaw:
			*f.raw(p) = append(json.RawMessage(nil), val...)
		case kUsage:
			if val[0] != '{' {
				return fmt.Errorf("omni: field %q: not an object", f.name)
			}
			u, ok := parseUsage(val)
			if !ok {
				u = new(Usage)
				if err := json.Unmarshal(val, u); err != nil {
					return fmt.Errorf("omni: field %q: %w", f.name, err)
				}
				raw.usage[f.slot] = rawUsage{raw: append([]byte(nil), val...), val: *u}
				usageRaw = true
			}
			*f.usage(p) = u
		}
		p.present |= bit
		return nil
	})
	if err != nil {
		return 0, err
	}
	if inOrder {
		p.present |= decodedInOrder
	} else {
		raw.order = slices.Clone(order)
	}
	if raw.order != nil || raw.extra != nil || usageRaw {
		p.raw = new(raw)
	}
	return end, nil
}

// usageKeys are the keys of a token count object as Floe writes it.
var usageKeys = [...]string{`{"cache_read":`, `,"cache_write":`, `,"output":`, `,"total":`}

// parseUsage decodes a token count object written exactly as appendUsage
// writes it (what Floe writes), without encoding/json and with no bytes to
// keep; ok is false for any other form.
func parseUsage(val []byte) (u *Usage, ok bool) {
	var v Usage
	counts := [...]*int64{&v.CacheRead, &v.CacheWrite, &v.Output, &v.Total}
	rest := val
	for k, key := range usageKeys {
		if len(rest) < len(key) || string(rest[:len(key)]) != key {
			return nil, false
		}
		rest = rest[len(key):]
		j := 0
		for j < len(rest) && (rest[j] == '-' || rest[j] >= '0' && rest[j] <= '9') {
			j++
		}
		n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
		if err != nil {
			return nil, false
		}
		*counts[k] = n
		rest = rest[j:]
	}
	var buf [128]byte
	if string(rest) != "}" || !bytes.Equal(appendUsage(buf[:0], &v), val) {
		return nil, false
	}
	return &v, true
}

// fitsKind reports whether the JSON value val has the type a field of kind
// k holds (null fits every kind).
func fitsKind(k fieldKind, val []byte) bool {
	if string(val) == "null" {
		return true
	}
	switch k {
	case kString:
		return val[0] == '"'
	case kInt:
		_, err := parseInt(val)
		return err == nil || string(val) == `"unknown"`
	case kUsage:
		var u Usage
		return val[0] == '{' && json.Unmarshal(val, &u) == nil
	}
	return true
}

// knownTypes are the payload types Floe interprets; a payload of any other
// type is kept as it is.
var knownTypes = func() map[string]bool {
	m := map[string]bool{}
	for _, t := range []string{
		TypeText, TypeThinking, TypeToolCall, TypeToolCallOutput, TypeImageURL, TypeInlineData, TypeInlineThinking,
		TypePartialText, TypePartialThinking, TypePartialToolCall, TypePartialToolCallOutput,
		TypeToolListReady, TypeRequestBegin, TypeRequestEnd, TypeApprovalDecision, TypeTokenUsage,
		TypeCompactionBegin, TypeCompactionEnd, TypeAbort, TypeSubagent, TypeMCPConnectBegin, TypeMCPConnectEnd,
	} {
		m[t] = true
	}
	return m
}()

// payloadRef looks up the known payload field a raw quoted key names.
func payloadRef(key []byte) (fieldRef, bool) {
	inner := key[1 : len(key)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		ref, ok := fieldIndex[string(inner)]
		return ref, ok
	}
	ref, ok := fieldIndex[unescapeKey(key)]
	return ref, ok
}

// unescapeKey returns the name an escaped raw quoted key stands for, so that
// "t\u0065xt" means text here as it does to every other JSON reader.
func unescapeKey(key []byte) string {
	var s string
	if json.Unmarshal(key, &s) != nil {
		return ""
	}
	return s
}

// parseInt parses an integer field. Integral numbers written with a fraction
// or exponent (3.0, 1e3) are accepted while a float64 holds them exactly.
func parseInt(val []byte) (int64, error) {
	n, err := strconv.ParseInt(string(val), 10, 64)
	if err == nil {
		return n, nil
	}
	if bytes.ContainsAny(val, ".eE") {
		f, ferr := strconv.ParseFloat(string(val), 64)
		if ferr == nil && f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
			return int64(f), nil
		}
	}
	return 0, fmt.Errorf("not an integer: %.40s", val)
}

// decodeStringInto decodes the JSON string val, which scanString has
// checked, into dst.
func decodeStringInto(val []byte, dst *string, field string) error {
	if len(val) < 2 || val[0] != '"' {
		return fmt.Errorf("omni: field %q: not a string", field)
	}
	inner := val[1 : len(val)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		*dst = intern(inner)
		return nil
	}
	*dst = unquote(inner)
	return nil
}

// interned holds the closed-set values (types, roles, statuses, …) so that
// decoding them allocates nothing.
var interned = func() map[string]string {
	m := make(map[string]string)
	for _, s := range []string{
		string(KindSessionMeta), string(KindModel), string(KindEvent),
		TypeText, TypeThinking, TypeToolCall, TypeToolCallOutput, TypeImageURL, TypeInlineData, TypeInlineThinking,
		TypePartialText, TypePartialThinking, TypePartialToolCall, TypePartialToolCallOutput,
		TypeToolListReady, TypeRequestBegin, TypeRequestEnd, TypeApprovalDecision, TypeTokenUsage,
		TypeCompactionBegin, TypeCompactionEnd, TypeAbort, TypeSubagent,
		RoleUser, RoleAssistant, EventStart, EventDelta, EventStop,
		StatusCompleted, StatusFailed, StatusAborted, StatusTimeout, StatusMalformed, StatusAuth,
		StatusRetryable, StatusFatal, TypeHook,
		DecisionAllow, DecisionDeny, DecisionForbidden,
		CompactContext, CompactTurns, CompactManual, ModeSummarize, ModeDiscard, "",
	} {
		m[s] = s
	}
	return m
}()

func intern(b []byte) string {
	if len(b) <= len(TypePartialToolCallOutput) {
		if s, ok := interned[string(b)]; ok {
			return s
		}
	}
	return string(b)
}

// unquote decodes the inside of a JSON string that scanString has checked,
// exactly as encoding/json does: a \u escape of a lone or mismatched surrogate
// and every byte of invalid UTF-8 become U+FFFD.
func unquote(inner []byte) string {
	var sb strings.Builder
	sb.Grow(len(inner))
	for i := 0; i < len(inner); {
		c := inner[i]
		if c != '\\' {
			// Copy the run up to the next escape, repairing invalid UTF-8.
			j := bytes.IndexByte(inner[i:], '\\')
			if j < 0 {
				j = len(inner)
			} else {
				j += i
			}
			appendValidUTF8(&sb, inner[i:j])
			i = j
			continue
		}
		e := inner[i+1]
		i += 2
		switch e {
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'n':
			sb.WriteByte('\n')
		case 'r':
			sb.WriteByte('\r')
		case 't':
			sb.WriteByte('\t')
		case 'u':
			r := hex4(inner[i:])
			i += 4
			if utf16.IsSurrogate(r) {
				if i+6 <= len(inner) && inner[i] == '\\' && inner[i+1] == 'u' {
					if d := utf16.DecodeRune(r, hex4(inner[i+2:])); d != utf8.RuneError {
						sb.WriteRune(d)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			sb.WriteRune(r)
		default: // " \ /
			sb.WriteByte(e)
		}
	}
	return sb.String()
}

func appendValidUTF8(sb *strings.Builder, b []byte) {
	if utf8.Valid(b) {
		sb.Write(b)
		return
	}
	for len(b) > 0 {
		if b[0] < utf8.RuneSelf {
			sb.WriteByte(b[0])
			b = b[1:]
			continue
		}
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			sb.WriteString("\uFFFD")
		} else {
			sb.Write(b[:size])
		}
		b = b[size:]
	}
}

// hex4 decodes four hex digits that scanString has checked.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c <= 'F':
			c -= 'A' - 10
		default:
			c -= 'a' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// scanObjectDepth walks the object starting at b[i], depth levels deep, and
// calls fn with each raw quoted key and raw value. It returns the index
// after the closing brace.
func scanObjectDepth(b []byte, i, depth int, fn func(key, val []byte) error) (int, error) {
	return scanMembers(b, i, depth, func(key []byte, at int) (int, error) {
		end, err := skipValue(b, at, depth+1)
		if err != nil {
			return 0, err
		}
		return end, fn(key, b[at:end])
	})
}

// scanMembers walks the object starting at b[i], at nesting depth depth,
// and calls member with each raw quoted key and the index of its value,
// which member reads (checking its syntax) and returns the index after.
// It returns the index after the closing brace.
func scanMembers(b []byte, i, depth int, member func(key []byte, at int) (int, error)) (int, error) {
	if i >= len(b) || b[i] != '{' {
		return 0, fmt.Errorf("%w: expected an object", ErrSyntax)
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, fmt.Errorf("%w: expected a key at offset %d", ErrSyntax, i)
		}
		kend, err := scanString(b, i)
		if err != nil {
			return 0, err
		}
		key := b[i:kend]
		i = skipWS(b, kend)
		if i >= len(b) || b[i] != ':' {
			return 0, fmt.Errorf("%w: expected : at offset %d", ErrSyntax, i)
		}
		i = skipWS(b, i+1)
		vend, err := member(key, i)
		if err != nil {
			return 0, err
		}
		i = skipWS(b, vend)
		if i >= len(b) {
			return 0, fmt.Errorf("%w: unterminated object", ErrSyntax)
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return i + 1, nil
		default:
			return 0, fmt.Errorf("%w: expected , or } at offset %d", ErrSyntax, i)
		}
	}
}

// scanString returns the index after the JSON string starting at b[i],
// checking its syntax. Runs of plain bytes are skipped a word at a time:
// the next quote and backslash are found with bytes.IndexByte, and a run
// is checked for control characters eight bytes at once.
func scanString(b []byte, i int) (int, error) {
	j := i + 1
	quote := -1 // the next " at or after j (len(b): none); stale when < j
	for {
		if quote < j {
			quote = indexFrom(b, j, '"')
		}
		esc := quote // the first \ before it
		if k := bytes.IndexByte(b[j:quote], '\\'); k >= 0 {
			esc = j + k
		}
		if k := firstControl(b[j:esc]); k >= 0 {
			return 0, fmt.Errorf("%w: control character in string at offset %d", ErrSyntax, j+k)
		}
		if esc == len(b) {
			return 0, fmt.Errorf("%w: unterminated string", ErrSyntax)
		}
		if esc == quote {
			return quote + 1, nil
		}
		// An escape at esc.
		j = esc + 1
		if j >= len(b) {
			return 0, fmt.Errorf("%w: unterminated string", ErrSyntax)
		}
		switch b[j] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			if j+4 >= len(b) || !isHex(b[j+1]) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) {
				return 0, fmt.Errorf("%w: bad \\u escape at offset %d", ErrSyntax, j)
			}
			j += 4
		default:
			return 0, fmt.Errorf("%w: bad escape at offset %d", ErrSyntax, j)
		}
		j++
	}
}

// indexFrom is the index of the first c in b at or after i, len(b) if none.
func indexFrom(b []byte, i int, c byte) int {
	if k := bytes.IndexByte(b[i:], c); k >= 0 {
		return i + k
	}
	return len(b)
}

// firstControl is the index of the first byte of s below 0x20, -1 if none.
func firstControl(s []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(s); i += 8 {
		// Nonzero when some byte is below 0x20 (exact for bytes < 0x80,
		// and a byte >= 0x80 has its high bit set in x).
		if x := binary.LittleEndian.Uint64(s[i:]); (x-0x20*ones)&^x&highs != 0 {
			break
		}
	}
	for ; i < len(s); i++ {
		if s[i] < 0x20 {
			return i
		}
	}
	return -1
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

const maxDepth = 256

// skipValue returns the index after the JSON value starting at b[i],
// checking its syntax.
func skipValue(b []byte, i, depth int) (int, error) {
	if depth > maxDepth {
		return 0, fmt.Errorf("%w: nested too deeply", ErrSyntax)
	}
	if i >= len(b) {
		return 0, fmt.Errorf("%w: unexpected end of input", ErrSyntax)
	}
	switch c := b[i]; {
	case c == '"':
		return scanString(b, i)
	case c == '{':
		return scanObjectDepth(b, i, depth, func(_, _ []byte) error { return nil })
	case c == '[':
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, nil
		}
		for {
			end, err := skipValue(b, i, depth+1)
			if err != nil {
				return 0, err
			}
			i = skipWS(b, end)
			if i >= len(b) {
				return 0, fmt.Errorf("%w: unterminated array", ErrSyntax)
			}
			if b[i] == ']' {
				return i + 1, nil
			}
			if b[i] != ',' {
				return 0, fmt.Errorf("%w: expected , or ] at offset %d", ErrSyntax, i)
			}
			i = skipWS(b, i+1)
		}
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return scanNumber(b, i)
	default:
		return 0, fmt.Errorf("%w: unexpected %q at offset %d", ErrSyntax, c, i)
	}
}

func literal(b []byte, i int, lit string) (int, error) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), nil
	}
	return 0, fmt.Errorf("%w: bad literal at offset %d", ErrSyntax, i)
}

func scanNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return 0, fmt.Errorf("%w: bad number at offset %d", ErrSyntax, start)
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return 0, fmt.Errorf("%w: bad number at offset %d", ErrSyntax, start)
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0, fmt.Errorf("%w: bad number at offset %d", ErrSyntax, start)
		}
	}
	return i, nil
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
