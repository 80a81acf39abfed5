package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// schema is a compiled tool Parameters schema: the subset of JSON Schema the
// built-in tools use.
type schema struct {
	props    map[string]property
	order    []string // property names as declared
	required []string
	closed   bool // additionalProperties: false
}

// property is one entry of a schema's properties.
type property struct {
	Type    string   `json:"type"`    // string, integer, number, boolean, or empty for any
	Minimum *float64 `json:"minimum"` // for integer and number
}

// compileSchema parses a Parameters schema. It understands type "object",
// properties with type string, integer, number or boolean and an optional
// minimum, required, and additionalProperties false; other keywords (such
// as description) are ignored.
func compileSchema(raw json.RawMessage) (*schema, error) {
	var top struct {
		Type                 string          `json:"type"`
		Properties           json.RawMessage `json:"properties"`
		Required             []string        `json:"required"`
		AdditionalProperties *bool           `json:"additionalProperties"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("parse schema: %w", err)
	}
	if top.Type != "object" {
		return nil, fmt.Errorf("schema type is %q, want \"object\"", top.Type)
	}
	s := &schema{
		props:    map[string]property{},
		required: top.Required,
		closed:   top.AdditionalProperties != nil && !*top.AdditionalProperties,
	}
	if len(top.Properties) > 0 {
		dec := json.NewDecoder(bytes.NewReader(top.Properties))
		if t, err := dec.Token(); err != nil || t != json.Delim('{') {
			return nil, errors.New("schema properties is not an object")
		}
		for dec.More() {
			t, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("parse schema properties: %w", err)
			}
			name := t.(string) // object keys are always strings
			var p property
			if err := dec.Decode(&p); err != nil {
				return nil, fmt.Errorf("parse schema property %q: %w", name, err)
			}
			switch p.Type {
			case "", "string", "integer", "number", "boolean":
			default:
				return nil, fmt.Errorf("schema property %q has unsupported type %q", name, p.Type)
			}
			if _, dup := s.props[name]; dup {
				return nil, fmt.Errorf("schema property %q is declared twice", name)
			}
			s.props[name] = p
			s.order = append(s.order, name)
		}
	}
	for _, name := range s.required {
		if _, ok := s.props[name]; !ok {
			return nil, fmt.Errorf("schema requires %q, which is not a property", name)
		}
	}
	return s, nil
}

// check validates the arguments text of a call and returns it as a JSON
// object together with its fields. Empty text is {}. A null optional field
// counts as absent. The error lists every problem, naming the fields.
func (s *schema) check(args string) (json.RawMessage, map[string]json.RawMessage, error) {
	text := strings.TrimSpace(args)
	if text == "" {
		text = "{}"
	}
	if !json.Valid([]byte(text)) {
		var v any
		err := json.Unmarshal([]byte(text), &v)
		return nil, nil, fmt.Errorf("arguments are not valid JSON: %v", err)
	}
	if k := kind([]byte(text)); k != "object" {
		return nil, nil, fmt.Errorf("arguments must be a JSON object, got %s", k)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &fields); err != nil {
		return nil, nil, fmt.Errorf("arguments must be a JSON object: %v", err)
	}

	var problems []string
	for _, name := range s.required {
		if v, ok := fields[name]; !ok || kind(v) == "null" {
			problems = append(problems, fmt.Sprintf("missing required field %q", name))
		}
	}
	for _, name := range s.order {
		v, ok := fields[name]
		if !ok || kind(v) == "null" {
			continue
		}
		if msg := s.props[name].check(v); msg != "" {
			problems = append(problems, fmt.Sprintf("field %q %s", name, msg))
		}
	}
	if s.closed {
		var unknown []string
		for name := range fields {
			if _, ok := s.props[name]; !ok {
				unknown = append(unknown, name)
			}
		}
		slices.Sort(unknown)
		for _, name := range unknown {
			problems = append(problems, fmt.Sprintf("unknown field %q (allowed: %s)", name, strings.Join(s.order, ", ")))
		}
	}
	if len(problems) > 0 {
		return nil, nil, errors.New(strings.Join(problems, "; "))
	}
	return json.RawMessage(text), fields, nil
}

// check returns what is wrong with value v, or "".
func (p property) check(v json.RawMessage) string {
	k := kind(v)
	switch p.Type {
	case "":
		return ""
	case "integer":
		if k != "number" {
			return "must be an integer, got " + k
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if errors.Is(err, strconv.ErrRange) {
			return "must fit in 64 bits, got " + string(v)
		}
		if err != nil {
			return "must be an integer, got " + string(v)
		}
		if p.Minimum != nil && float64(n) < *p.Minimum {
			return fmt.Sprintf("must be at least %v, got %d", *p.Minimum, n)
		}
	case "number":
		if k != "number" {
			return "must be a number, got " + k
		}
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return "must be a number, got " + string(v)
		}
		if p.Minimum != nil && f < *p.Minimum {
			return fmt.Sprintf("must be at least %v, got %v", *p.Minimum, f)
		}
	default:
		if k != p.Type {
			return "must be a " + p.Type + ", got " + k
		}
	}
	return ""
}

// intField returns the integer field name of fields, if present.
func intField(fields map[string]json.RawMessage, name string) (int64, bool) {
	v, ok := fields[name]
	if !ok || kind(v) != "number" {
		return 0, false
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil
}

// kind names the JSON type of the valid JSON value v.
func kind(v []byte) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	default:
		return "number"
	}
}
