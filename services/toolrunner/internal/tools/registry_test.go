package tools

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"floe.dev/services/toolrunner/internal/argschema"
)

// fakeTool is a Tool whose Run is a function.
type fakeTool struct {
	name   string
	params string
	run    func(ctx context.Context, call Call, args json.RawMessage, emit Emit) Result
}

func (f fakeTool) Spec() Spec {
	params := f.params
	if params == "" {
		params = `{"type":"object","properties":{},"additionalProperties":false}`
	}
	name := f.name
	if name == "" {
		name = "fake"
	}
	return Spec{Name: name, Description: "a fake", Parameters: json.RawMessage(params), Permission: PermRead}
}

func (f fakeTool) Run(ctx context.Context, call Call, args json.RawMessage, emit Emit) Result {
	return f.run(ctx, call, args, emit)
}

func TestExecuteRejectsBadCallsWithoutRunning(t *testing.T) {
	ws := t.TempDir()
	r := Builtin(Options{})
	tests := []struct {
		name      string
		tool      string
		arguments string
		want      string
	}{
		{"unknown tool", "rm_rf", `{}`,
			`unknown tool "rm_rf"; available: exec_command, read_file, write_file, edit_file`},
		{"invalid JSON", "exec_command", `{"description": "d", "cmd": "touch ran"`,
			`invalid arguments for exec_command: arguments are not valid JSON: unexpected end of JSON input`},
		{"trailing garbage", "exec_command", `{"description": "d", "cmd": "touch ran"} x`,
			`invalid arguments for exec_command: arguments are not valid JSON: invalid character 'x' after top-level value`},
		{"array", "exec_command", `["touch ran"]`,
			`invalid arguments for exec_command: arguments must be a JSON object, got array`},
		{"null", "exec_command", `null`,
			`invalid arguments for exec_command: arguments must be a JSON object, got null`},
		{"missing required field", "exec_command", `{"description": "d"}`,
			`invalid arguments for exec_command: missing required field "cmd"`},
		{"required field null", "exec_command", `{"description": "d", "cmd": null}`,
			`invalid arguments for exec_command: missing required field "cmd"`},
		{"empty arguments are {}", "read_file", ``,
			`invalid arguments for read_file: missing required field "file_path"`},
		{"string is a number", "exec_command", `{"description": "d", "cmd": 42}`,
			`invalid arguments for exec_command: field "cmd" must be a string, got number`},
		{"integer is a string", "exec_command", `{"description": "d", "cmd": "touch ran", "timeout_ms": "300"}`,
			`invalid arguments for exec_command: field "timeout_ms" must be an integer, got string`},
		{"integer is a fraction", "exec_command", `{"description": "d", "cmd": "touch ran", "timeout_ms": 1.5}`,
			`invalid arguments for exec_command: field "timeout_ms" must be an integer, got 1.5`},
		{"integer too large", "exec_command", `{"description": "d", "cmd": "touch ran", "timeout_ms": 99999999999999999999}`,
			`invalid arguments for exec_command: field "timeout_ms" must fit in 64 bits, got 99999999999999999999`},
		{"integer below minimum", "read_file", `{"file_path": "a", "offset": 0}`,
			`invalid arguments for read_file: field "offset" must be at least 1, got 0`},
		{"boolean is a string", "edit_file", `{"file_path": "a", "old_string": "x", "new_string": "y", "replace_all": "yes"}`,
			`invalid arguments for edit_file: field "replace_all" must be a boolean, got string`},
		{"unknown field", "exec_command", `{"description": "d", "cmd": "touch ran", "shell": "zsh"}`,
			`invalid arguments for exec_command: unknown field "shell" (allowed: description, cmd, workdir, timeout_ms)`},
		{"every problem at once", "write_file", `{"content": 1, "mode": 420, "append": true}`,
			`invalid arguments for write_file: missing required field "file_path"; field "content" must be a string, got number; ` +
				`unknown field "append" (allowed: file_path, content); unknown field "mode" (allowed: file_path, content)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := execute(t, t.Context(), r, Call{Name: tt.tool, Arguments: tt.arguments, Workspace: ws})
			if !res.Failed || res.Output != tt.want {
				t.Errorf("Execute(%s, %s) = %+v, want failed with %q", tt.tool, tt.arguments, res, tt.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(ws, "ran")); err == nil {
		t.Error("a rejected exec_command ran")
	}
}

func TestExecuteTreatsNullOptionalFieldsAsAbsent(t *testing.T) {
	r := Builtin(Options{})
	res := execute(t, t.Context(), r, Call{
		Name:      "exec_command",
		Arguments: `{"description": "d", "cmd": "echo ok", "workdir": null, "timeout_ms": null}`,
		Workspace: t.TempDir(),
	})
	if res.Failed || res.Output != "ok\n" {
		t.Errorf("Execute = %+v, want ok", res)
	}
}

func TestExecutePassesValidatedArguments(t *testing.T) {
	tests := []struct {
		name      string
		arguments string
		want      string
	}{
		{"empty is an empty object", "", "{}"},
		{"blank is an empty object", " \n", "{}"},
		{"object passes as written", ` {"n": 3} `, `{"n": 3}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got string
			r := NewRegistry(Options{}, fakeTool{
				params: `{"type":"object","properties":{"n":{"type":"integer"}},"additionalProperties":false}`,
				run: func(_ context.Context, _ Call, args json.RawMessage, _ Emit) Result {
					got = string(args)
					return Result{Output: "ran"}
				},
			})
			res := execute(t, t.Context(), r, Call{Name: "fake", Arguments: tt.arguments})
			if res.Failed || got != tt.want {
				t.Errorf("Execute(%q) passed %q (%+v), want %q", tt.arguments, got, res, tt.want)
			}
		})
	}
}

func TestExecuteCapsOutputAndKeepsEmitInvariant(t *testing.T) {
	tests := []struct {
		name      string
		max       int
		fragments []string
		returned  string
		failed    bool
		want      string
	}{
		{name: "under the cap", max: 5, fragments: []string{"abc"}, want: "abc"},
		{name: "exactly the cap", max: 5, fragments: []string{"ab", "cde"}, want: "abcde"},
		{name: "over the cap", max: 5, fragments: []string{"abc", "def", "gh"},
			want: "abcde\n[output truncated: 3 more characters]"},
		{name: "head ending in a newline", max: 3, fragments: []string{"ab\ncd"},
			want: "ab\n[output truncated: 2 more characters]"},
		{name: "multibyte runes count as one character", max: 4, fragments: []string{"héllo wörld"},
			want: "héll\n[output truncated: 7 more characters]"},
		{name: "cap never splits a rune", max: 2, fragments: []string{"日本語"},
			want: "日本\n[output truncated: 1 more characters]"},
		{name: "runes split across fragments are joined", max: 10, fragments: []string{"h\xc3", "\xa9", "\xe2\x82", "\xac!"},
			want: "hé€!"},
		{name: "4-byte rune split byte by byte", max: 1, fragments: []string{"\xf0", "\x9f", "\x98", "\x80", "\xf0\x9f", "\x98\x80"},
			want: "😀\n[output truncated: 1 more characters]"},
		{name: "invalid UTF-8 becomes U+FFFD", max: 10, fragments: []string{"a\xffb"}, want: "a\uFFFDb"},
		{name: "incomplete rune at the end becomes U+FFFD", max: 10, fragments: []string{"ab\xe2\x82"}, want: "ab\uFFFD"},
		{name: "returned text follows on its own line", max: 10, fragments: []string{"x"}, returned: "y", want: "x\ny"},
		{name: "returned text after a newline", max: 10, fragments: []string{"x\n"}, returned: "y", want: "x\ny"},
		{name: "returned text survives a truncated stream", max: 14, fragments: []string{"0123456789", "abcdefghij"},
			returned: "[exit code: 1]", failed: true,
			want: "0123456789abcd\n[output truncated: 6 more characters]\n[exit code: 1]"},
		{name: "returned text alone is capped", max: 3, returned: "abcdefgh",
			want: "abc\n[output truncated: 5 more characters]"},
		{name: "nothing at all", max: 5, want: NoOutput},
		{name: "nothing but a failure", max: 5, failed: true, want: NoOutput},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRegistry(Options{MaxOutput: tt.max}, fakeTool{
				run: func(_ context.Context, _ Call, _ json.RawMessage, emit Emit) Result {
					for _, f := range tt.fragments {
						emit(f)
					}
					return Result{Output: tt.returned, Failed: tt.failed}
				},
			})
			res := execute(t, t.Context(), r, Call{Name: "fake"})
			if res.Output != tt.want || res.Failed != tt.failed {
				t.Errorf("Execute = %+v, want {Output:%q Failed:%v}", res, tt.want, tt.failed)
			}
		})
	}
}

func TestExecuteRecoversToolPanic(t *testing.T) {
	r := NewRegistry(Options{}, fakeTool{
		run: func(_ context.Context, _ Call, _ json.RawMessage, emit Emit) Result {
			emit("partial")
			panic("boom")
		},
	})
	res := execute(t, t.Context(), r, Call{Name: "fake"})
	if want := "partial\n[tool panicked: boom]"; !res.Failed || res.Output != want {
		t.Errorf("Execute = %+v, want failed with %q", res, want)
	}
}

func TestExecuteTimesOutAnyTool(t *testing.T) {
	r := NewRegistry(Options{DefaultTimeout: 50 * time.Millisecond}, fakeTool{
		run: func(ctx context.Context, _ Call, _ json.RawMessage, emit Emit) Result {
			emit("waiting")
			<-ctx.Done()
			return Result{}
		},
	})
	res := execute(t, t.Context(), r, Call{Name: "fake"})
	if want := "waiting\n[timed out after 50ms]"; !res.Failed || res.Output != want {
		t.Errorf("Execute = %+v, want failed with %q", res, want)
	}
}

func TestExecuteStopsWhenCallerCancels(t *testing.T) {
	blocking := fakeTool{
		run: func(ctx context.Context, _ Call, _ json.RawMessage, emit Emit) Result {
			emit("working")
			<-ctx.Done()
			return Result{}
		},
	}
	t.Run("during the call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		r := NewRegistry(Options{}, blocking)
		res := executeWith(t, ctx, r, Call{Name: "fake"}, func(string) { cancel() })
		if want := "working\n[canceled]"; !res.Failed || res.Output != want {
			t.Errorf("Execute = %+v, want failed with %q", res, want)
		}
	})
	t.Run("before the call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		ran := false
		r := NewRegistry(Options{}, fakeTool{run: func(context.Context, Call, json.RawMessage, Emit) Result {
			ran = true
			return Result{}
		}})
		res := execute(t, ctx, r, Call{Name: "fake"})
		if ran || !res.Failed || res.Output != "[canceled]" {
			t.Errorf("Execute = %+v (ran %v), want failed with [canceled] and not run", res, ran)
		}
	})
	t.Run("caller deadline", func(t *testing.T) {
		ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
		defer cancel()
		r := NewRegistry(Options{}, blocking)
		res := execute(t, ctx, r, Call{Name: "fake"})
		if want := "[canceled: context deadline exceeded]"; !res.Failed || res.Output != want {
			t.Errorf("Execute = %+v, want failed with %q", res, want)
		}
	})
}

func TestExecuteDropsEmitsAfterRunReturns(t *testing.T) {
	release, done := make(chan struct{}), make(chan struct{})
	r := NewRegistry(Options{}, fakeTool{
		run: func(_ context.Context, _ Call, _ json.RawMessage, emit Emit) Result {
			go func() {
				defer close(done)
				<-release
				emit("late")
			}()
			return Result{Output: "done"}
		},
	})
	var frags []string
	res := r.Execute(t.Context(), Call{Name: "fake"}, func(s string) { frags = append(frags, s) })
	close(release)
	<-done
	checkFragments(t, frags, res)
	if res.Output != "done" {
		t.Errorf("Execute = %+v, want done", res)
	}
}

func TestExecuteAcceptsNilEmit(t *testing.T) {
	r := Builtin(Options{})
	res := r.Execute(t.Context(), Call{Name: "nope"}, nil)
	if !res.Failed {
		t.Errorf("Execute = %+v, want failed", res)
	}
}

func TestBuiltinSpecs(t *testing.T) {
	r := Builtin(Options{})
	want := []struct {
		name, perm string
		required   []string
		properties []string
	}{
		{"exec_command", PermReadWrite, []string{"description", "cmd"}, []string{"description", "cmd", "workdir", "timeout_ms"}},
		{"read_file", PermRead, []string{"file_path"}, []string{"file_path", "offset", "limit"}},
		{"write_file", PermReadWrite, []string{"file_path", "content"}, []string{"file_path", "content"}},
		{"edit_file", PermReadWrite, []string{"file_path", "old_string", "new_string"}, []string{"file_path", "old_string", "new_string", "replace_all"}},
	}
	specs := r.Specs()
	if len(specs) != len(want) {
		t.Fatalf("Specs() has %d tools, want %d", len(specs), len(want))
	}
	for i, w := range want {
		s := specs[i]
		if s.Name != w.name || s.Permission != w.perm || s.Description == "" {
			t.Errorf("Specs()[%d] = %s %q, want %s %q with a description", i, s.Name, s.Permission, w.name, w.perm)
		}
		var schema struct {
			Type                 string                     `json:"type"`
			Properties           map[string]json.RawMessage `json:"properties"`
			Required             []string                   `json:"required"`
			AdditionalProperties *bool                      `json:"additionalProperties"`
		}
		if err := json.Unmarshal(s.Parameters, &schema); err != nil {
			t.Fatalf("%s parameters: %v", s.Name, err)
		}
		if schema.Type != "object" || schema.AdditionalProperties == nil || *schema.AdditionalProperties {
			t.Errorf("%s schema = %s, want a closed object", s.Name, s.Parameters)
		}
		if !slices.Equal(schema.Required, w.required) {
			t.Errorf("%s required = %v, want %v", s.Name, schema.Required, w.required)
		}
		compiled, err := argschema.Compile(s.Parameters, argschema.Options{})
		if err != nil || !slices.Equal(compiled.Properties(), w.properties) {
			t.Errorf("%s properties = %v (%v), want %v", s.Name, compiled.Properties(), err, w.properties)
		}
		if strings.ContainsAny(string(s.Parameters), "\n\t") {
			t.Errorf("%s parameters are not compact: %s", s.Name, s.Parameters)
		}
		if tool, ok := r.Lookup(w.name); !ok || tool.Spec().Name != w.name {
			t.Errorf("Lookup(%q) = %v, %v", w.name, tool, ok)
		}
	}
	if _, ok := r.Lookup("nope"); ok {
		t.Error("Lookup(nope) found a tool")
	}
	specs[0].Parameters[0] = 'X'
	if r.Specs()[0].Parameters[0] != '{' {
		t.Error("changing a returned Spec changed the registry")
	}
}

func TestNewRegistryPanicsOnProgrammingErrors(t *testing.T) {
	tests := []struct {
		name  string
		tools []Tool
	}{
		{"duplicate name", []Tool{fakeTool{}, fakeTool{}}},
		{"invalid JSON schema", []Tool{fakeTool{params: `{`}}},
		{"schema not an object", []Tool{fakeTool{params: `{"type":"string"}`}}},
		{"property type not a JSON type", []Tool{fakeTool{params: `{"type":"object","properties":{"x":{"type":"arry"}}}`}}},
		{"required field not a property", []Tool{fakeTool{params: `{"type":"object","properties":{},"required":["x"]}`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("NewRegistry did not panic")
				}
			}()
			NewRegistry(Options{}, tt.tools...)
		})
	}
}
