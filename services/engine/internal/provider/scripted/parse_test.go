package scripted

import (
	"errors"
	"strings"
	"testing"

	"floe.dev/services/engine/internal/model"
)

func TestParseRejectsMalformedScripts(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want string // the whole error text
	}{
		{
			name: "bad JSON names the line",
			src:  "{\n  \"requests\": [\n    {\"steps\": [}\n  ]\n}",
			want: `test.json:3: invalid JSON`,
		},
		{
			name: "truncated JSON",
			src:  `{"requests": [`,
			want: `test.json:1: invalid JSON: unexpected end of input`,
		},
		{
			name: "not an object",
			src:  `[1]`,
			want: `test.json:1: want an object, got an array`,
		},
		{
			name: "missing requests",
			src:  `{"context_window": 10}`,
			want: `test.json:1: missing field "requests"`,
		},
		{
			name: "unknown top-level field",
			src:  "{\"requests\": [],\n \"afterlast\": \"fail\"}",
			want: `test.json:2: unknown field "afterlast" (want context_window, requests, after_last, final_text, title)`,
		},
		{
			name: "duplicate field",
			src:  `{"requests": [], "requests": []}`,
			want: `test.json:1: duplicate field "requests"`,
		},
		{
			name: "unknown step kind",
			src:  "{\"requests\": [\n {\"steps\": [{\"text\": \"a\"}]},\n {\"steps\": []},\n {\"steps\": [\n\n   {\"txt\": \"hi\"}]}]}",
			want: `test.json:6: requests[2].steps[0]: unknown step kind "txt" (want thinking, text, tool_call, parallel_tool_calls, error or delay_ms)`,
		},
		{
			name: "unknown field in a step",
			src:  `{"requests": [{"steps": [{"text": "a", "chunk": 2}]}]}`,
			want: `test.json:1: requests[0].steps[0]: unknown field "chunk" in a text step`,
		},
		{
			name: "two kinds in one step",
			src:  `{"requests": [{"steps": [{"text": "a", "thinking": "b"}]}]}`,
			want: `test.json:1: requests[0].steps[0]: a step has one kind, got both "text" and "thinking"`,
		},
		{
			name: "empty step",
			src:  `{"requests": [{"steps": [{}]}]}`,
			want: `test.json:1: requests[0].steps[0]: empty step (want one of thinking, text, tool_call, parallel_tool_calls, error, delay_ms)`,
		},
		{
			name: "modifier on the wrong kind",
			src:  `{"requests": [{"steps": [{"text": "a", "interleave": true}]}]}`,
			want: `test.json:1: requests[0].steps[0]: "interleave" is not allowed on a text step`,
		},
		{
			name: "tool_call without name",
			src:  "{\"requests\": [{\"steps\": [\n  {\"tool_call\": {\"id\": \"c\", \"arguments\": {}}}]}]}",
			want: `test.json:2: requests[0].steps[0].tool_call: tool call without "name"`,
		},
		{
			name: "tool_call with an empty name",
			src:  `{"requests": [{"steps": [{"tool_call": {"name": ""}}]}]}`,
			want: `test.json:1: requests[0].steps[0].tool_call.name: must not be empty`,
		},
		{
			name: "parallel call without name",
			src:  `{"requests": [{"steps": [{"parallel_tool_calls": [{"name": "a"}, {"id": "b"}]}]}]}`,
			want: `test.json:1: requests[0].steps[0].parallel_tool_calls[1]: tool call without "name"`,
		},
		{
			name: "empty parallel step",
			src:  `{"requests": [{"steps": [{"parallel_tool_calls": []}]}]}`,
			want: `test.json:1: requests[0].steps[0].parallel_tool_calls: want at least one tool call`,
		},
		{
			name: "both argument forms",
			src:  `{"requests": [{"steps": [{"tool_call": {"name": "a", "arguments": {}, "arguments_raw": "{}"}}]}]}`,
			want: `test.json:1: requests[0].steps[0].tool_call: set arguments or arguments_raw, not both`,
		},
		{
			name: "arguments_raw not a string",
			src:  `{"requests": [{"steps": [{"tool_call": {"name": "a", "arguments_raw": {}}}]}]}`,
			want: `test.json:1: requests[0].steps[0].tool_call.arguments_raw: want a string, got an object`,
		},
		{
			name: "chunks on the step and in the call",
			src:  `{"requests": [{"steps": [{"tool_call": {"name": "a", "chunks": 2}, "chunks": 3}]}]}`,
			want: `test.json:1: requests[0].steps[0].tool_call.chunks: also set on the step; set it in one place`,
		},
		{
			name: "unknown field in a tool call",
			src:  `{"requests": [{"steps": [{"tool_call": {"name": "a", "args": {}}}]}]}`,
			want: `test.json:1: requests[0].steps[0].tool_call: unknown field "args" in a tool call (want name, id, arguments, arguments_raw, chunks, delay_ms, fidelity)`,
		},
		{
			name: "unknown error status",
			src:  `{"requests": [{"steps": [{"error": {"status": "overloaded"}}]}]}`,
			want: `test.json:1: requests[0].steps[0].error.status: unknown status "overloaded" (want one of failed, timeout, malformed, auth)`,
		},
		{
			name: "error without status",
			src:  `{"requests": [{"steps": [{"error": {"message": "x"}}]}]}`,
			want: `test.json:1: requests[0].steps[0].error: missing field "status" (failed, timeout, malformed or auth)`,
		},
		{
			name: "negative delay",
			src:  `{"requests": [{"steps": [{"delay_ms": -5}]}]}`,
			want: `test.json:1: requests[0].steps[0].delay_ms: must be >= 0, got -5`,
		},
		{
			name: "negative delay on a call",
			src:  `{"requests": [{"steps": [{"parallel_tool_calls": [{"name": "a", "delay_ms": -1}]}]}]}`,
			want: `test.json:1: requests[0].steps[0].parallel_tool_calls[0].delay_ms: must be >= 0, got -1`,
		},
		{
			name: "fractional delay",
			src:  `{"requests": [{"steps": [{"delay_ms": 1.5}]}]}`,
			want: `test.json:1: requests[0].steps[0].delay_ms: want an integer, got 1.5`,
		},
		{
			name: "negative chunks",
			src:  `{"requests": [{"steps": [{"text": "a", "chunks": -1}]}]}`,
			want: `test.json:1: requests[0].steps[0].chunks: must be >= 0, got -1`,
		},
		{
			name: "text not a string",
			src:  `{"requests": [{"steps": [{"text": 5}]}]}`,
			want: `test.json:1: requests[0].steps[0].text: want a string, got a number`,
		},
		{
			name: "fidelity not an object",
			src:  `{"requests": [{"steps": [{"text": "a", "fidelity": "sig"}]}]}`,
			want: `test.json:1: requests[0].steps[0].fidelity: want an object, got a string`,
		},
		{
			name: "open block without a later error",
			src:  "{\"requests\": [{\"steps\": [\n{\"text\": \"a\", \"end\": false},\n{\"text\": \"b\"}]}]}",
			want: `test.json:2: requests[0].steps[0]: "end": false needs a later error step in the same request`,
		},
		{
			name: "unknown request field",
			src:  `{"requests": [{"steps": [], "expect_last_usr": "x"}]}`,
			want: `test.json:1: requests[0]: unknown field "expect_last_usr" (want steps, usage, stop_reason, expect_last_user, expect_tool_outputs)`,
		},
		{
			name: "expect_tool_outputs not strings",
			src:  `{"requests": [{"expect_tool_outputs": ["a", 2]}]}`,
			want: `test.json:1: requests[0].expect_tool_outputs[1]: want a string, got a number`,
		},
		{
			name: "negative usage",
			src:  `{"requests": [{"usage": {"total": -1}}]}`,
			want: `test.json:1: requests[0].usage.total: must be >= 0, got -1`,
		},
		{
			name: "unknown usage field",
			src:  `{"requests": [{"usage": {"input": 1}}]}`,
			want: `test.json:1: requests[0].usage: unknown field "input" (want cache_read, cache_write, output, total)`,
		},
		{
			name: "unknown stop reason",
			src:  `{"requests": [{"stop_reason": "length"}]}`,
			want: `test.json:1: requests[0].stop_reason: unknown status "length" (want one of completed, failed, aborted, timeout, malformed, auth)`,
		},
		{
			name: "unknown after_last",
			src:  `{"requests": [], "after_last": "loop"}`,
			want: `test.json:1: after_last: unknown mode "loop" (want fail, repeat_last or final_text)`,
		},
		{
			name: "repeat_last without requests",
			src:  `{"requests": [], "after_last": "repeat_last"}`,
			want: `test.json:1: after_last: repeat_last needs at least one request`,
		},
		{
			name: "final_text without its mode",
			src:  `{"requests": [], "final_text": "bye"}`,
			want: `test.json:1: final_text: only allowed with "after_last": "final_text"`,
		},
		{
			name: "zero context window",
			src:  `{"requests": [], "context_window": 0}`,
			want: `test.json:1: context_window: must be >= 1, got 0`,
		},
		{
			name: "request not an object",
			src:  `{"requests": ["hi"]}`,
			want: `test.json:1: requests[0]: want an object, got a string`,
		},
		{
			name: "steps not an array",
			src:  `{"requests": [{"steps": {"text": "a"}}]}`,
			want: `test.json:1: requests[0].steps: want an array, got an object`,
		},
		{
			name: "end not a boolean",
			src:  `{"requests": [{"steps": [{"text": "a", "end": "no"}]}]}`,
			want: `test.json:1: requests[0].steps[0].end: want true or false, got a string`,
		},
		{
			name: "delay over a day",
			src:  `{"requests": [{"steps": [{"delay_ms": 86400001}]}]}`,
			want: `test.json:1: requests[0].steps[0].delay_ms: must be <= 86400000 (a day), got 86400001`,
		},
		{
			name: "http_status out of range",
			src:  `{"requests": [{"steps": [{"error": {"status": "failed", "http_status": 4000}}]}]}`,
			want: `test.json:1: requests[0].steps[0].error.http_status: must be <= 999, got 4000`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("test.json", []byte(tt.src))
			if err == nil {
				t.Fatalf("Parse succeeded (%v), want error %q", p, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("Parse error =\n  %s\nwant\n  %s", err, tt.want)
			}
			if _, ok := errors.AsType[*ScriptError](err); !ok {
				t.Errorf("error is %T, want *ScriptError", err)
			}
		})
	}
}

func TestParseAcceptsEveryFeature(t *testing.T) {
	src := `{
	  "context_window": 1000,
	  "requests": [
	    {"steps": [
	      {"thinking": "t", "chunks": 2, "delay_ms": 0, "fidelity": {"a": [1, 2]}},
	      {"text": "x", "end": false},
	      {"tool_call": {"name": "n", "id": "i", "arguments": [1, "two", null], "chunks": 1, "delay_ms": 1, "fidelity": {}}},
	      {"tool_call": {"name": "n"}, "chunks": 3, "delay_ms": 2, "fidelity": {"b": true}, "end": true},
	      {"parallel_tool_calls": [{"name": "a"}, {"name": "b", "arguments_raw": ""}], "interleave": false, "chunks": 2, "delay_ms": 1},
	      {"delay_ms": 3},
	      {"error": {"status": "malformed", "message": "m", "http_status": 0}, "delay_ms": 1}
	    ], "usage": {"cache_read": 1, "cache_write": 2, "output": 3, "total": 4}, "stop_reason": "completed",
	    "expect_last_user": "", "expect_tool_outputs": []},
	    {}
	  ],
	  "after_last": "fail"
	}`
	p, err := Parse("all.json", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	s := p.script
	if len(s.requests) != 2 || len(s.requests[0].steps) != 7 || len(s.requests[1].steps) != 0 {
		t.Fatalf("parsed %d requests, want 2 with 7 and 0 steps", len(s.requests))
	}
	steps := s.requests[0].steps
	if c := steps[2].calls[0]; c.args != `[1,"two",null]` || c.chunks != 1 || string(c.fidelity) != `{}` {
		t.Errorf("tool call = %+v", c)
	}
	if c := steps[3].calls[0]; c.chunks != 3 || c.delay.Milliseconds() != 2 || string(c.fidelity) != `{"b":true}` || c.args != "{}" {
		t.Errorf("step-level modifiers did not reach the call: %+v", c)
	}
	if c := steps[4].calls[1]; c.chunks != 2 || c.args != "" {
		t.Errorf("parallel defaults: %+v", c)
	}
	if !steps[1].open || steps[3].open {
		t.Errorf("open flags = %v, %v; want true, false", steps[1].open, steps[3].open)
	}
	if strings.Contains(string(steps[0].fidelity), " ") {
		t.Errorf("fidelity %s not compacted", steps[0].fidelity)
	}
}

// FuzzParse checks that no input panics the parser, and that every script it
// accepts plays without panicking.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		`{"requests": []}`,
		`{"requests": [{"steps": [{"text": "a", "chunks": 2}, {"tool_call": {"name": "x", "arguments": {"a": 1}}}]}]}`,
		`{"requests": [{"steps": [{"parallel_tool_calls": [{"name": "a"}, {"name": "b"}], "interleave": true}]}]}`,
		`{"requests": [{"steps": [{"text": "a", "end": false}, {"error": {"status": "timeout"}}]}], "after_last": "repeat_last"}`,
		`{"requests": [{"steps": [{"txt": "a"}]}]}`,
		"{\n\"requests\": [\n{\"steps\": [}]}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("fuzz.json", data)
		if err != nil {
			if _, ok := errors.AsType[*ScriptError](err); !ok {
				t.Fatalf("error %v is %T, want *ScriptError", err, err)
			}
			return
		}
		for _, r := range p.script.requests {
			for i := range r.steps {
				r.steps[i].delay = 0 // keep the fuzzer fast
				for j := range r.steps[i].calls {
					r.steps[i].calls[j].delay = 0
				}
			}
		}
		for range 2 {
			_, _ = p.Stream(t.Context(), newReq("s"), func(model.Delta) error { return nil })
		}
	})
}
