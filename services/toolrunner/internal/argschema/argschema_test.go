package argschema

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rich is the kind of input schema MCP servers list: nested objects,
// arrays, enums, anyOf, draft-07 from zod.
const rich = `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "type": "object",
  "properties": {
    "query": {"type": "string", "minLength": 1, "maxLength": 10},
    "limit": {"type": "integer", "minimum": 1, "maximum": 100},
    "ratio": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5},
    "mode": {"enum": ["fast", "slow"]},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "uniqueItems": true},
    "filter": {
      "type": "object",
      "properties": {"field": {"type": "string"}, "op": {"const": "eq"}},
      "required": ["field"],
      "additionalProperties": false
    },
    "target": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
    "ref": {"$ref": "#/definitions/id"}
  },
  "required": ["query"],
  "additionalProperties": false,
  "definitions": {"id": {"type": "string", "format": "uuid"}}
}`

func TestCheckWordsEachProblem(t *testing.T) {
	s, err := Compile(json.RawMessage(rich), Options{})
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	tests := []struct {
		name, args, want string
	}{
		{"too short", `{"query": ""}`, `field "query" must be at least 1 characters long, got 0`},
		{"too long", `{"query": "abcdefghijk"}`, `field "query" must be at most 10 characters long, got 11`},
		{"above maximum", `{"query": "q", "limit": 101}`, `field "limit" must be at most 100, got 101`},
		{"exclusive minimum", `{"query": "q", "ratio": 0}`, `field "ratio" must be greater than 0, got 0`},
		{"multiple of", `{"query": "q", "ratio": 0.7}`, `field "ratio" must be a multiple of 0.5, got 0.7`},
		{"enum", `{"query": "q", "mode": "medium"}`, `field "mode" must be one of "fast", "slow", got "medium"`},
		{"array item", `{"query": "q", "tags": ["a", 2]}`, `field "tags[1]" must be a string, got number`},
		{"too many items", `{"query": "q", "tags": ["a", "b", "c"]}`, `field "tags" must have at most 2 items, got 3`},
		{"unique items", `{"query": "q", "tags": ["a", "a"]}`, `field "tags" must have unique items, but items 0 and 1 are equal`},
		{"nested object", `{"query": "q", "filter": {"op": "ne", "x": 1}}`,
			`field "filter" is missing required field "field"; field "filter" has unknown field "x"; field "filter.op" must be "eq", got "ne"`},
		{"anyOf", `{"query": "q", "target": 1.5}`,
			`field "target" must match one of its allowed forms (form 1: must be a string, got number; form 2: must be an integer, got 1.5)`},
		{"pattern", `{"query": "q", "code": "abc"}`, `field "code" must match the pattern "^[A-Z]{3}$", got "abc"`},
		{"through a $ref", `{"query": "q", "ref": 7}`, `field "ref" must be a string, got number`},
		{"format (asserted by draft-07)", `{"query": "q", "ref": "x"}`, `field "ref" must be a valid uuid, got "x" (must have 5 elements)`},
		{"null is a value", `{"query": null}`, `field "query" must be a string, got null`},
		{"64 bits", `{"query": "q", "limit": 1e30}`, `field "limit" must be at most 100, got 1e30`},
		{"all at once, in declared order", `{"tags": "x", "limit": 0, "zz": 1, "aa": 2}`,
			`missing required field "query"; field "limit" must be at least 1, got 0; field "tags" must be an array, got string; ` +
				`unknown field "aa" (allowed: query, limit, ratio, mode, tags, filter, target, code, ref); ` +
				`unknown field "zz" (allowed: query, limit, ratio, mode, tags, filter, target, code, ref)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := s.Check(tt.args)
			if err == nil || err.Error() != tt.want {
				t.Errorf("Check(%s) = %v,\nwant %s", tt.args, err, tt.want)
			}
		})
	}
}

func TestCheckPassesValidArguments(t *testing.T) {
	s, err := Compile(json.RawMessage(rich), Options{})
	if err != nil {
		t.Fatal(err)
	}
	args := ` {"query": "q", "limit": 5, "ratio": 1.5, "mode": "fast", "tags": ["a"], "filter": {"field": "f", "op": "eq"}, "target": 3, "code": "ABC", "ref": "0b7e4a5c-1d2f-4c3b-9a8e-7f6d5c4b3a21"} `
	raw, fields, err := s.Check(args)
	if err != nil {
		t.Fatalf("Check = %v", err)
	}
	if string(raw) != strings.TrimSpace(args) {
		t.Errorf("raw = %s, want the trimmed arguments", raw)
	}
	if n, ok := fields["limit"].(json.Number); !ok || n != "5" {
		t.Errorf(`fields["limit"] = %#v, want json.Number("5")`, fields["limit"])
	}
}

func TestIntegersFitInt64(t *testing.T) {
	s, err := Compile(json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"},"any":{}}}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ args, want string }{
		{`{"n": 9223372036854775807}`, ""},
		{`{"n": -9223372036854775808}`, ""},
		{`{"n": 9223372036854775808}`, `field "n" must fit in 64 bits, got 9223372036854775808`},
		{`{"n": 2.0}`, `field "n" must be an integer, got 2.0`},
		{`{"n": 1e3}`, `field "n" must be an integer, got 1e3`},
		{`{"any": 99999999999999999999}`, ""}, // only integer properties are read as int64
	}
	for _, tt := range tests {
		_, _, err := s.Check(tt.args)
		if got := errText(err); got != tt.want {
			t.Errorf("Check(%s) = %q, want %q", tt.args, got, tt.want)
		}
	}
	if !s.Integer("n") || s.Integer("any") || s.Integer("nope") {
		t.Error("Integer() does not follow the schema")
	}
}

func TestNullIsAbsent(t *testing.T) {
	raw := json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"required":["a"]}`)
	lenient, err := Compile(raw, Options{NullIsAbsent: true})
	if err != nil {
		t.Fatal(err)
	}
	strict, err := Compile(raw, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := lenient.Check(`{"a": "x", "b": null}`); err != nil {
		t.Errorf("lenient optional null: %v", err)
	}
	if _, _, err := lenient.Check(`{"a": null}`); errText(err) != `missing required field "a"` {
		t.Errorf("lenient required null: %v", err)
	}
	if _, _, err := strict.Check(`{"a": "x", "b": null}`); errText(err) != `field "b" must be an integer, got null` {
		t.Errorf("strict optional null: %v", err)
	}
}

func TestCheckRejectsWhatIsNotAnObject(t *testing.T) {
	s, err := Compile(json.RawMessage(`{"type":"object"}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ args, want string }{
		{`{"a":`, "arguments are not valid JSON: unexpected end of JSON input"},
		{`{} x`, "arguments are not valid JSON: invalid character 'x' after top-level value"},
		{`[1]`, "arguments must be a JSON object, got array"},
		{`"s"`, "arguments must be a JSON object, got string"},
		{`null`, "arguments must be a JSON object, got null"},
	}
	for _, tt := range tests {
		if _, _, err := s.Check(tt.args); errText(err) != tt.want {
			t.Errorf("Check(%s) = %v, want %s", tt.args, err, tt.want)
		}
	}
	if raw, _, err := s.Check("  "); err != nil || string(raw) != "{}" {
		t.Errorf("Check(blank) = %s, %v, want {}", raw, err)
	}
}

// TestCompileRejectsBadSchemas is what a broken MCP server can list: each
// is a clear error, never a panic, and nothing is read from disk or the
// network.
func TestCompileRejectsBadSchemas(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(secret, []byte(`{"type":"string"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, schema, want string }{
		{"not JSON", `{`, "not JSON"},
		{"not an object", `[]`, "a schema must be a JSON object, got array"},
		{"no type", `{}`, `type is null, want "object"`},
		{"type not object", `{"type":"string"}`, `type is "string", want "object"`},
		{"type not a string", `{"type":["object"]}`, `type is ["object"], want "object"`},
		{"unknown type name", `{"type":"object","properties":{"x":{"type":"arry"}}}`, "not a valid JSON Schema: at /properties/x/type"},
		{"properties not an object", `{"type":"object","properties":[]}`, "not a valid JSON Schema: at /properties"},
		{"minimum not a number", `{"type":"object","properties":{"x":{"minimum":"1"}}}`, "not a valid JSON Schema: at /properties/x/minimum"},
		{"bad pattern", `{"type":"object","properties":{"x":{"pattern":"("}}}`, "not a valid JSON Schema: at /properties/x/pattern: '(' is not valid regex"},
		{"missing $ref", `{"type":"object","properties":{"x":{"$ref":"#/$defs/missing"}}}`, "not a usable JSON Schema"},
		{"$ref to a file", `{"type":"object","properties":{"x":{"$ref":"file://` + secret + `"}}}`, "only references inside the schema are allowed"},
		{"$ref to the network", `{"type":"object","properties":{"x":{"$ref":"http://127.0.0.1:1/s.json"}}}`, "only references inside the schema are allowed"},
		{"property twice", `{"type":"object","properties":{"x":{},"x":{}}}`, `property "x" is declared twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Compile(json.RawMessage(tt.schema), Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Compile(%s) = %v, %v; want an error containing %q", tt.schema, s, err, tt.want)
			}
		})
	}
}

func TestCompileToleratesUnknownDialects(t *testing.T) {
	for _, d := range []string{"https://example.com/my-dialect", "http://json-schema.org/draft-04/schema#", "https://json-schema.org/draft/2020-12/schema"} {
		s, err := Compile(json.RawMessage(`{"$schema":"`+d+`","type":"object","properties":{"x":{"type":"string"}}}`), Options{})
		if err != nil {
			t.Errorf("Compile with $schema %s: %v", d, err)
			continue
		}
		if _, _, err := s.Check(`{"x": 1}`); errText(err) != `field "x" must be a string, got number` {
			t.Errorf("$schema %s: Check = %v", d, err)
		}
	}
}

// FuzzCompileAndCheck: no schema and no arguments make Compile or Check
// panic.
func FuzzCompileAndCheck(f *testing.F) {
	f.Add(rich, `{"query": "q", "tags": ["a", 2], "filter": {}}`)
	f.Add(`{"type":"object","properties":{"n":{"type":"integer","minimum":1}},"required":["n"],"additionalProperties":false}`, `{"n": 0, "x": null}`)
	f.Add(`{"type":"object","properties":{"a":{"oneOf":[{"type":"string"},{"type":"string","minLength":1}]}}}`, `{"a": "x"}`)
	f.Add(`{"type":"object","properties":{"a":{"not":{"type":"null"}},"b":false}}`, `{"a": null, "b": 1}`)
	f.Add(`{"type":"object","$defs":{"r":{"$ref":"#/$defs/r"}},"properties":{"a":{"$ref":"#/$defs/r"}}}`, `{"a": 1}`)
	f.Add(`{"type":"object","dependentRequired":{"a":["b"]},"patternProperties":{"^x":{"type":"integer"}}}`, `{"a": 1, "xy": "s"}`)
	f.Fuzz(func(t *testing.T, schema, args string) {
		for _, opts := range []Options{{}, {NullIsAbsent: true}} {
			s, err := Compile(json.RawMessage(schema), opts)
			if err != nil {
				if err.Error() == "" {
					t.Fatal("empty compile error")
				}
				continue
			}
			raw, _, err := s.Check(args)
			if err != nil {
				if err.Error() == "" {
					t.Fatal("empty check error")
				}
				continue
			}
			if !json.Valid(raw) {
				t.Fatalf("Check(%q) accepted invalid JSON %q", args, raw)
			}
		}
	})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
