// Package argschema is the toolrunner's one JSON Schema validator: it
// compiles a tool's parameters schema once (a built-in tool's at start, an
// MCP tool's when its server lists it) and checks each call's arguments
// against it, saying in the model's terms what is wrong: which argument,
// what was expected, every problem at once.
//
// Validation is github.com/santhosh-tekuri/jsonschema/v6 (drafts 4, 6, 7,
// 2019-09 and 2020-12, every problem collected with a typed kind); this
// package maps its error kinds to our wording, orders the problems as the
// schema declares its properties, and adds what the library leaves out: an
// integer argument must fit in 64 bits. A Schema is immutable and safe for
// concurrent use.
package argschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Options changes how a Schema reads arguments.
type Options struct {
	// NullIsAbsent makes a top-level argument whose value is null count as
	// absent: a required one is missing, an optional one is not checked.
	// Models in strict function-calling modes send null for optional
	// arguments they leave out.
	NullIsAbsent bool
}

// Schema is a compiled parameters schema: a JSON Schema whose type is
// "object".
type Schema struct {
	sch      *jsonschema.Schema
	order    []string       // top-level property names, as declared
	index    map[string]int // position of each name in order
	ints     []string       // top-level properties whose only type is integer
	required []string
	opts     Options
}

// schemaURL names the one resource of each compilation; no other URL is
// ever loaded.
const schemaURL = "floe:///parameters.json"

// knownDrafts are the $schema values the validator understands; any other
// $schema is dropped (the schema is read as draft 2020-12) rather than
// fetched.
var knownDrafts = map[string]bool{}

func init() {
	for _, d := range []string{
		"json-schema.org/draft-04/schema", "json-schema.org/draft-06/schema",
		"json-schema.org/draft-07/schema", "json-schema.org/draft/2019-09/schema",
		"json-schema.org/draft/2020-12/schema",
	} {
		for _, scheme := range []string{"http://", "https://"} {
			knownDrafts[scheme+d] = true
			knownDrafts[scheme+d+"#"] = true
		}
	}
}

// noLoader refuses every URL: a schema is self-contained, it never makes
// the toolrunner read a file or the network.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("reference to %s: only references inside the schema are allowed", url)
}

// Compile parses and compiles a parameters schema. It fails, saying why,
// on text that is not JSON, a schema whose type is not "object", a schema
// the JSON Schema meta-schema rejects, and a $ref that leaves the schema.
func Compile(raw json.RawMessage, opts Options) (*Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("a schema must be a JSON object, got %s", kindOf(doc))
	}
	if typ, _ := obj["type"].(string); typ != "object" {
		return nil, fmt.Errorf("type is %s, want \"object\"", display(obj["type"]))
	}
	if d, ok := obj["$schema"].(string); ok && !knownDrafts[d] {
		delete(obj, "$schema")
	}
	s := &Schema{opts: opts, index: map[string]int{}}
	if err := s.readProperties(raw, obj); err != nil {
		return nil, err
	}

	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, obj); err != nil {
		return nil, err
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, compileError(err)
	}
	s.sch = sch
	for _, name := range s.order {
		if p := sch.Properties[name]; p != nil && p.Types != nil {
			if t := p.Types.ToStrings(); len(t) == 1 && t[0] == "integer" {
				s.ints = append(s.ints, name)
			}
		}
	}
	if req, ok := obj["required"].([]any); ok {
		for _, r := range req {
			if name, ok := r.(string); ok {
				s.required = append(s.required, name)
			}
		}
	}
	return s, nil
}

// readProperties records the top-level property names in the order the
// schema text declares them (a decoded map has lost it), for the order
// of problems and the list of allowed names.
func (s *Schema) readProperties(raw json.RawMessage, obj map[string]any) error {
	if _, ok := obj["properties"].(map[string]any); !ok {
		return nil // the meta-schema check says what is wrong, if anything
	}
	var top struct {
		Properties json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(top.Properties))
	if _, err := dec.Token(); err != nil { // the '{' of an object, checked above
		return fmt.Errorf("properties: %w", err)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("properties: %w", err)
		}
		name, _ := t.(string) // object keys are always strings
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("property %q: %w", name, err)
		}
		if _, dup := s.index[name]; dup {
			return fmt.Errorf("property %q is declared twice", name)
		}
		s.index[name] = len(s.order)
		s.order = append(s.order, name)
	}
	return nil
}

// compileError shortens the library's compile errors to what a server's
// author needs: the keyword and what is wrong with it.
func compileError(err error) error {
	var sve *jsonschema.SchemaValidationError
	if errors.As(err, &sve) && sve.Err != nil {
		var verr *jsonschema.ValidationError
		if errors.As(sve.Err, &verr) {
			return fmt.Errorf("not a valid JSON Schema: %s", strings.Join(metaProblems(verr), "; "))
		}
	}
	return fmt.Errorf("not a usable JSON Schema: %s", strings.TrimPrefix(err.Error(), "jsonschema: "))
}

// metaProblems lists the leaves of a meta-schema validation error as
// "at <schema location>: <what is wrong>".
func metaProblems(e *jsonschema.ValidationError) []string {
	if len(e.Causes) > 0 {
		var out []string
		for _, c := range e.Causes {
			out = append(out, metaProblems(c)...)
		}
		return out
	}
	at := "/" + strings.Join(e.InstanceLocation, "/")
	return []string{"at " + at + ": " + e.ErrorKind.LocalizedString(english)}
}

// Properties returns the top-level property names in declared order.
func (s *Schema) Properties() []string { return append([]string(nil), s.order...) }

// Integer reports whether top-level property name has the one type
// integer.
func (s *Schema) Integer(name string) bool { return slices.Contains(s.ints, name) }

// Required returns the names the schema's top level requires.
func (s *Schema) Required() []string { return append([]string(nil), s.required...) }

// Check validates the arguments text of a call and returns it trimmed
// (empty text is {}) with its top-level fields decoded, numbers as
// json.Number. The error lists every problem, separated by "; ":
// required fields first, then each field's problems in declared order,
// then unknown fields by name.
func (s *Schema) Check(args string) (json.RawMessage, map[string]any, error) {
	text := strings.TrimSpace(args)
	if text == "" {
		text = "{}"
	}
	if !json.Valid([]byte(text)) {
		var v any
		err := json.Unmarshal([]byte(text), &v)
		return nil, nil, fmt.Errorf("arguments are not valid JSON: %v", err)
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil { // valid JSON always decodes; kept for safety
		return nil, nil, fmt.Errorf("arguments are not valid JSON: %v", err)
	}
	fields, ok := doc.(map[string]any)
	if !ok {
		return nil, nil, fmt.Errorf("arguments must be a JSON object, got %s", kindOf(doc))
	}
	checked := fields
	if s.opts.NullIsAbsent {
		checked = withoutNulls(fields)
	}
	var ps problems
	if err := s.sch.Validate(checked); err != nil {
		var verr *jsonschema.ValidationError
		if !errors.As(err, &verr) {
			return nil, nil, fmt.Errorf("arguments: %v", err)
		}
		ps.walk(s, verr, checked)
	}
	// The library accepts any whole number as an integer; the tools decode
	// integers into int64, which takes neither 1e3 nor 2.0 nor more than 64
	// bits.
	for _, name := range s.ints {
		n, ok := checked[name].(json.Number)
		if !ok || ps.has(name) {
			continue
		}
		if _, err := strconv.ParseInt(string(n), 10, 64); errors.Is(err, strconv.ErrRange) {
			ps.add(s, []string{name}, "must fit in 64 bits, got "+string(n))
		} else if err != nil {
			ps.add(s, []string{name}, "must be an integer, got "+string(n))
		}
	}
	if len(ps) > 0 {
		return nil, nil, errors.New(ps.String())
	}
	return json.RawMessage(text), fields, nil
}

// withoutNulls returns fields without its null values; fields itself if it
// has none.
func withoutNulls(fields map[string]any) map[string]any {
	for _, v := range fields {
		if v != nil {
			continue
		}
		out := make(map[string]any, len(fields))
		for n, v := range fields {
			if v != nil {
				out[n] = v
			}
		}
		return out
	}
	return fields
}
