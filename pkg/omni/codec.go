package omni

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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
	str   func(*Payload) *string
	num   func(*Payload) *int64
	raw   func(*Payload) *json.RawMessage
	usage func(*Payload) **Usage
}

func sf(name string, f func(*Payload) *string) fieldDef { return fieldDef{name: name, kind: kString, str: f} }
func nf(name string, f func(*Payload) *int64) fieldDef  { return fieldDef{name: name, kind: kInt, num: f} }
func rf(name string, f func(*Payload) *json.RawMessage) fieldDef {
	return fieldDef{name: name, kind: kRaw, raw: f}
}
func uf(name string, f func(*Payload) **Usage) fieldDef { return fieldDef{name: name, kind: kUsage, usage: f} }

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
	uf("session", func(p *Payload) **Usage { return &p.Session }),
	uf("request", func(p *Payload) **Usage { return &p.Request }),
	sf("reason", func(p *Payload) *string { return &p.Reason }),
	sf("mode", func(p *Payload) *string { return &p.Mode }),
	nf("context", func(p *Payload) *int64 { return &p.Context }),
	nf("turns", func(p *Payload) *int64 { return &p.Turns }),
}

var fieldIndex = func() map[string]fieldRef {
	m := make(map[string]fieldRef, len(fields))
	for i, f := range fields {
		m[f.name] = fieldRef(i)
	}
	return m
}()

type fieldSet uint64

type fieldRef uint16

// extraBase marks a fieldRef that indexes Payload.extra.
const extraBase fieldRef = 1 << 15

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
		return *f.num(p) != 0
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
	return m.AppendJSON(make([]byte, 0, 256)), nil
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
// (fidelity, images, tools, unknown fields) are written as they are: they
// must hold valid JSON, which Marshal checks and decoding guarantees.
func (m *Message) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"timestamp":`...)
	dst = appendString(dst, m.Timestamp)
	dst = append(dst, `,"type":`...)
	dst = appendString(dst, string(m.Type))
	dst = append(dst, `,"payload":`...)
	dst = m.Payload.appendJSON(dst)
	if len(m.Origin) > 0 {
		dst = append(dst, `,"origin":[`...)
		for i, o := range m.Origin {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, o)
		}
		dst = append(dst, ']')
	}
	for _, x := range m.extra {
		dst = append(dst, ',')
		dst = append(dst, x.key...)
		dst = append(dst, ':')
		dst = append(dst, x.value...)
	}
	return append(dst, '}')
}

func (p *Payload) appendJSON(dst []byte) []byte {
	dst = append(dst, '{')
	first := true
	var written fieldSet
	for _, ref := range p.order {
		if ref >= extraBase {
			x := p.extra[ref-extraBase]
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst = append(dst, x.key...)
			dst = append(dst, ':')
			dst = append(dst, x.value...)
			continue
		}
		i := int(ref)
		if written&(1<<uint(i)) != 0 || !p.isSet(i) {
			continue
		}
		written |= 1 << uint(i)
		dst = p.appendField(dst, i, first)
		first = false
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
		dst = strconv.AppendInt(dst, *f.num(p), 10)
	case kRaw:
		r := *f.raw(p)
		if len(r) == 0 {
			r = []byte("null")
		}
		dst = append(dst, r...)
	case kUsage:
		u := *f.usage(p)
		if u == nil {
			dst = append(dst, "null"...)
		} else {
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
// Validate checks meaning. Unknown envelope and payload fields are kept.
func Unmarshal(b []byte, m *Message) error {
	*m = Message{}
	i := skipWS(b, 0)
	end, err := scanObject(b, i, func(key, val []byte) error {
		switch string(key) {
		case `"timestamp"`:
			return decodeStringInto(val, &m.Timestamp, "timestamp")
		case `"type"`:
			var t string
			err := decodeStringInto(val, &t, "type")
			m.Type = Kind(t)
			return err
		case `"payload"`:
			if len(val) == 0 || val[0] != '{' {
				return fmt.Errorf("%w: payload is not an object", ErrSyntax)
			}
			return m.Payload.decode(val)
		case `"origin"`:
			return decodeOrigin(val, &m.Origin)
		default:
			m.extra = append(m.extra, rawField{key: string(key), value: append([]byte(nil), val...)})
			return nil
		}
	})
	if err != nil {
		return err
	}
	if skipWS(b, end) != len(b) {
		return fmt.Errorf("%w: trailing data after message", ErrSyntax)
	}
	return nil
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
		*out = []string{}
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

func (p *Payload) decode(b []byte) error {
	_, err := scanObject(b, 0, func(key, val []byte) error {
		ref, known := fieldIndex[unquotedKey(key)]
		if !known || string(val) == "null" {
			p.order = append(p.order, extraBase+fieldRef(len(p.extra)))
			p.extra = append(p.extra, rawField{key: string(key), value: append([]byte(nil), val...)})
			return nil
		}
		i := int(ref)
		f := &fields[i]
		if p.present&(1<<uint(i)) != 0 {
			return fmt.Errorf("%w: duplicate field %q", ErrSyntax, f.name)
		}
		switch f.kind {
		case kString:
			if err := decodeStringInto(val, f.str(p), f.name); err != nil {
				return err
			}
		case kInt:
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
			u := new(Usage)
			if err := json.Unmarshal(val, u); err != nil {
				return fmt.Errorf("omni: field %q: %w", f.name, err)
			}
			*f.usage(p) = u
		}
		p.present |= 1 << uint(i)
		p.order = append(p.order, ref)
		return nil
	})
	return err
}

// unquotedKey returns the key without quotes when it has no escapes (the
// common case); an escaped key never matches a known field.
func unquotedKey(key []byte) string {
	for _, c := range key[1 : len(key)-1] {
		if c == '\\' {
			return ""
		}
	}
	return string(key[1 : len(key)-1])
}

func parseInt(val []byte) (int64, error) {
	n, err := strconv.ParseInt(string(val), 10, 64)
	if err == nil {
		return n, nil
	}
	f, ferr := strconv.ParseFloat(string(val), 64)
	if ferr == nil && f == float64(int64(f)) {
		return int64(f), nil
	}
	return 0, fmt.Errorf("not an integer: %.40s", val)
}

func decodeStringInto(val []byte, dst *string, field string) error {
	if len(val) < 2 || val[0] != '"' {
		return fmt.Errorf("omni: field %q: not a string", field)
	}
	inner := val[1 : len(val)-1]
	simple := true
	for _, c := range inner {
		if c == '\\' {
			simple = false
			break
		}
	}
	if simple && utf8.Valid(inner) {
		*dst = string(inner)
		return nil
	}
	if err := json.Unmarshal(val, dst); err != nil {
		return fmt.Errorf("omni: field %q: %w", field, err)
	}
	return nil
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

// scanObject walks the object starting at b[i] and calls fn with each raw
// quoted key and raw value. It returns the index after the closing brace.
func scanObject(b []byte, i int, fn func(key, val []byte) error) (int, error) {
	return scanObjectDepth(b, i, 0, fn)
}

func scanObjectDepth(b []byte, i, depth int, fn func(key, val []byte) error) (int, error) {
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
		vend, err := skipValue(b, i, depth+1)
		if err != nil {
			return 0, err
		}
		if err := fn(key, b[i:vend]); err != nil {
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

func scanString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, nil
		case c == '\\':
			j++
			if j >= len(b) {
				break
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
		case c < 0x20:
			return 0, fmt.Errorf("%w: control character in string at offset %d", ErrSyntax, j)
		}
	}
	return 0, fmt.Errorf("%w: unterminated string", ErrSyntax)
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
