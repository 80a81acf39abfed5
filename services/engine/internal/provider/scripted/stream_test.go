package scripted

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

func TestStreamPlaysEveryStepKind(t *testing.T) {
	type D = model.Delta
	tests := []struct {
		name       string
		steps      string // the steps array of a one-request script
		extra      string // more fields of the request entry
		want       []D
		wantStatus string // "" for success
		wantStop   string
	}{
		{
			name:  "thinking in three chunks with fidelity on the last",
			steps: `[{"thinking": "abcdefg", "chunks": 3, "fidelity": {"sig": "x" , "n": 1}}]`,
			want: []D{
				{Block: 0, Type: omni.TypeThinking, Text: "abc"},
				{Block: 0, Type: omni.TypeThinking, Text: "de"},
				{Block: 0, Type: omni.TypeThinking, Text: "fg", End: true, Fidelity: raw(`{"sig":"x","n":1}`)},
			},
		},
		{
			name:  "text with default fragments of 16",
			steps: `[{"text": "0123456789abcdefXYZ"}]`,
			want: []D{
				{Block: 0, Type: omni.TypeText, Text: "0123456789abcdef"},
				{Block: 0, Type: omni.TypeText, Text: "XYZ", End: true},
			},
		},
		{
			name:  "empty text is one ending delta",
			steps: `[{"text": "", "chunks": 4}]`,
			want:  []D{{Block: 0, Type: omni.TypeText, Text: "", End: true}},
		},
		{
			name:  "more chunks than code points gives one per code point",
			steps: `[{"text": "hé", "chunks": 5}]`,
			want: []D{
				{Block: 0, Type: omni.TypeText, Text: "h"},
				{Block: 0, Type: omni.TypeText, Text: "é", End: true},
			},
		},
		{
			name:  "tool call with compact arguments, name and id on the first delta",
			steps: `[{"tool_call": {"name": "exec_command", "id": "call_a", "arguments": {"cmd": "ls",  "description": "list"}, "chunks": 2}}]`,
			want: []D{
				{Block: 0, Type: omni.TypeToolCall, Text: `{"cmd":"ls","desc`, Name: "exec_command", ToolCallID: "call_a"},
				{Block: 0, Type: omni.TypeToolCall, Text: `ription":"list"}`, End: true},
			},
		},
		{
			name:  "tool call with raw invalid arguments and step-level chunks",
			steps: `[{"tool_call": {"name": "x", "id": "c1", "arguments_raw": "{\"a\": tru"}, "chunks": 2, "fidelity": {"k": 2}}]`,
			want: []D{
				{Block: 0, Type: omni.TypeToolCall, Text: `{"a":`, Name: "x", ToolCallID: "c1"},
				{Block: 0, Type: omni.TypeToolCall, Text: ` tru`, End: true, Fidelity: raw(`{"k":2}`)},
			},
		},
		{
			name:  "tool call without arguments streams {}",
			steps: `[{"tool_call": {"name": "x", "id": "c1"}}]`,
			want:  []D{{Block: 0, Type: omni.TypeToolCall, Text: `{}`, Name: "x", ToolCallID: "c1", End: true}},
		},
		{
			name:  "tool call without id gets an allocated one",
			steps: `[{"tool_call": {"name": "x"}}]`,
			want:  []D{{Block: 0, Type: omni.TypeToolCall, Text: `{}`, Name: "x", ToolCallID: "call_1", End: true}},
		},
		{
			name:  "reused tool call id is replaced",
			steps: `[{"tool_call": {"name": "x", "id": "dup"}}, {"tool_call": {"name": "y", "id": "dup"}}]`,
			want: []D{
				{Block: 0, Type: omni.TypeToolCall, Text: `{}`, Name: "x", ToolCallID: "dup", End: true},
				{Block: 1, Type: omni.TypeToolCall, Text: `{}`, Name: "y", ToolCallID: "call_1", End: true},
			},
		},
		{
			name: "parallel tool calls without interleave stream one after another",
			steps: `[{"parallel_tool_calls": [
				{"name": "a", "id": "ca", "arguments_raw": "1234", "chunks": 2},
				{"name": "b", "id": "cb", "arguments_raw": "56"}]}]`,
			want: []D{
				{Block: 0, Type: omni.TypeToolCall, Text: "12", Name: "a", ToolCallID: "ca"},
				{Block: 0, Type: omni.TypeToolCall, Text: "34", End: true},
				{Block: 1, Type: omni.TypeToolCall, Text: "56", Name: "b", ToolCallID: "cb", End: true},
			},
		},
		{
			name: "interleaved parallel tool calls go round-robin and end together",
			steps: `[{"text": "t"}, {"parallel_tool_calls": [
				{"name": "a", "id": "ca", "arguments_raw": "aaabbbccc", "chunks": 3, "fidelity": {"f": "a"}},
				{"name": "b", "id": "cb", "arguments_raw": "xxyy", "chunks": 2},
				{"name": "c", "id": "cc", "arguments_raw": "z"}], "interleave": true}]`,
			want: []D{
				{Block: 0, Type: omni.TypeText, Text: "t", End: true},
				{Block: 1, Type: omni.TypeToolCall, Text: "aaa", Name: "a", ToolCallID: "ca"},
				{Block: 2, Type: omni.TypeToolCall, Text: "xx", Name: "b", ToolCallID: "cb"},
				{Block: 3, Type: omni.TypeToolCall, Text: "z", Name: "c", ToolCallID: "cc"},
				{Block: 1, Type: omni.TypeToolCall, Text: "bbb"},
				{Block: 2, Type: omni.TypeToolCall, Text: "yy"},
				{Block: 1, Type: omni.TypeToolCall, Text: "ccc"},
				{Block: 1, Type: omni.TypeToolCall, End: true, Fidelity: raw(`{"f":"a"}`)},
				{Block: 2, Type: omni.TypeToolCall, End: true},
				{Block: 3, Type: omni.TypeToolCall, End: true},
			},
		},
		{
			name:  "delay step emits nothing",
			steps: `[{"delay_ms": 5}, {"text": "x"}]`,
			want:  []D{{Block: 0, Type: omni.TypeText, Text: "x", End: true}},
		},
		{
			name:       "error after output keeps the earlier deltas",
			steps:      `[{"text": "ok"}, {"error": {"status": "timeout", "message": "upstream reset"}}, {"text": "never"}]`,
			want:       []D{{Block: 0, Type: omni.TypeText, Text: "ok", End: true}},
			wantStatus: omni.StatusTimeout,
		},
		{
			name:       "error mid-block leaves the block open",
			steps:      `[{"text": "abcd", "chunks": 2, "end": false}, {"error": {"status": "malformed"}}]`,
			want:       []D{{Block: 0, Type: omni.TypeText, Text: "ab"}, {Block: 0, Type: omni.TypeText, Text: "cd"}},
			wantStatus: omni.StatusMalformed,
		},
		{
			name: "error mid interleaved step leaves every block open",
			steps: `[{"parallel_tool_calls": [{"name": "a", "id": "ca", "arguments_raw": "12"},
				{"name": "b", "id": "cb", "arguments_raw": "34"}], "interleave": true, "end": false},
				{"error": {"status": "auth", "http_status": 401}}]`,
			want: []D{
				{Block: 0, Type: omni.TypeToolCall, Text: "12", Name: "a", ToolCallID: "ca"},
				{Block: 1, Type: omni.TypeToolCall, Text: "34", Name: "b", ToolCallID: "cb"},
			},
			wantStatus: omni.StatusAuth,
		},
		{
			name:       "error first",
			steps:      `[{"error": {"status": "failed", "message": "bad request"}}]`,
			wantStatus: omni.StatusFailed,
		},
		{
			name:     "stop reason",
			steps:    `[{"text": "x"}]`,
			extra:    `, "stop_reason": "failed"`,
			want:     []D{{Block: 0, Type: omni.TypeText, Text: "x", End: true}},
			wantStop: omni.StatusFailed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustParse(t, `{"requests": [{"steps": `+tt.steps+tt.extra+`}]}`)
			got, res, err := run(t, p, newReq("s1", omni.UserText("hi")))
			if !equalDeltas(got, tt.want) {
				t.Errorf("deltas =\n%swant\n%s", fmtDeltas(got), fmtDeltas(tt.want))
			}
			if st := statusOf(err); st != tt.wantStatus {
				t.Errorf("error status = %q (%v), want %q", st, err, tt.wantStatus)
			}
			wantStop := tt.wantStop
			if wantStop == "" {
				wantStop = omni.StatusCompleted
			}
			if tt.wantStatus != "" {
				wantStop = tt.wantStatus
			}
			if res.StopReason != wantStop {
				t.Errorf("StopReason = %q, want %q", res.StopReason, wantStop)
			}
			if tt.wantStatus == "" {
				checkDiscipline(t, got)
			}
		})
	}
}

func TestErrorStepCarriesMessageAndHTTPStatus(t *testing.T) {
	p := mustParse(t, `{"requests": [
		{"steps": [{"error": {"status": "auth", "message": "bad key", "http_status": 401}}]},
		{"steps": [{"error": {"status": "timeout"}}]}]}`)
	_, _, err := run(t, p, newReq("s"))
	var me *model.Error
	if !errors.As(err, &me) || *me != (model.Error{Status: omni.StatusAuth, Message: "bad key", HTTPStatus: 401}) {
		t.Errorf("first error = %#v, want auth/bad key/401", err)
	}
	_, _, err = run(t, p, newReq("s"))
	if !errors.As(err, &me) || me.Message != "scripted timeout error" {
		t.Errorf("second error = %v, want default message %q", err, "scripted timeout error")
	}
}

func TestChunkingConcatenatesExactly(t *testing.T) {
	texts := []string{
		"", "a", "hello world", "日本語のテキストです。", "emoji 👩‍👩‍👧 mix é ü ß",
		strings.Repeat("x", 1000), "bad \xff\xfe utf8 \xe6\x97", "tabs\tand\nnewlines\r\n",
	}
	for _, s := range texts {
		for _, n := range []int{0, 1, 2, 3, 7, 16, 100, 5000} {
			pieces := split(s, n)
			if got := strings.Join(pieces, ""); got != s {
				t.Fatalf("split(%q, %d) joins to %q", s, n, got)
			}
			runes := utf8.RuneCountInString(s)
			want := min(n, runes)
			switch {
			case runes == 0:
				want = 1
			case n == 0:
				want = (runes + defaultFragment - 1) / defaultFragment
			}
			if len(pieces) != want {
				t.Errorf("len(split(%q, %d)) = %d, want %d", s, n, len(pieces), want)
			}
			if utf8.ValidString(s) {
				for _, piece := range pieces {
					if !utf8.ValidString(piece) {
						t.Errorf("split(%q, %d) cut a rune: piece %q", s, n, piece)
					}
				}
			}
		}
	}
}

func TestStreamedContentMatchesScript(t *testing.T) {
	text := "Une réponse assez longue, avec des accents — et des emoji 🚀🚀🚀 pour couper juste."
	p := mustParse(t, fmt.Sprintf(`{"requests": [{"steps": [
		{"thinking": %q, "chunks": 7},
		{"text": %q},
		{"tool_call": {"name": "write_file", "id": "w", "arguments": {"file_path": "a", "content": %q}, "chunks": 9}}]}]}`,
		text, text, text))
	got, _, err := run(t, p, newReq("s"))
	if err != nil {
		t.Fatal(err)
	}
	checkDiscipline(t, got)
	blocks := joinBlocks(got)
	wantArgs := fmt.Sprintf(`{"file_path":"a","content":%q}`, text)
	if blocks[0] != text || blocks[1] != text || blocks[2] != wantArgs {
		t.Errorf("blocks = %v, want thinking and text %q, args %q", blocks, text, wantArgs)
	}
}

func TestSessionsCountIndependently(t *testing.T) {
	p := mustParse(t, `{"requests": [{"steps": [{"text": "one"}]}, {"steps": [{"text": "two"}]}]}`)
	play := func(session string) string {
		got, _, err := run(t, p, newReq(session))
		if err != nil {
			return "error: " + err.Error()
		}
		return joinBlocks(got)[0]
	}
	steps := []struct{ session, want string }{
		{"a", "one"}, {"b", "one"}, {"a", "two"}, {"c", "one"}, {"b", "two"},
	}
	for _, s := range steps {
		if got := play(s.session); got != s.want {
			t.Errorf("Session %s: got %q, want %q", s.session, got, s.want)
		}
	}
	if p.Calls("a") != 2 || p.Calls("c") != 1 || p.Calls("nobody") != 0 {
		t.Errorf("Calls a, c, nobody = %d, %d, %d; want 2, 1, 0", p.Calls("a"), p.Calls("c"), p.Calls("nobody"))
	}
}

func TestConcurrentSessionsEachPlayTheWholeScript(t *testing.T) {
	p := mustParse(t, `{"requests": [{"steps": [{"text": "r1", "delay_ms": 1}]}, {"steps": [{"text": "r2"}]}, {"steps": [{"text": "r3"}]}]}`)
	const sessions, perSession, callsEach = 5, 4, 3
	var mu sync.Mutex
	played := map[string][]string{} // Session -> texts of successful calls
	var wg sync.WaitGroup
	for i := range sessions * perSession {
		wg.Go(func() {
			session := fmt.Sprintf("s%d", i%sessions)
			for range callsEach {
				ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
				var text string
				_, err := p.Stream(ctx, newReq(session), func(d model.Delta) error { text += d.Text; return nil })
				cancel()
				if err == nil {
					mu.Lock()
					played[session] = append(played[session], text)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	// perSession*callsEach calls per Session for a script of 3: exactly 3
	// succeed, one of each entry, whatever the interleaving.
	for i := range sessions {
		session := fmt.Sprintf("s%d", i)
		got := played[session]
		slices.Sort(got)
		if fmt.Sprint(got) != "[r1 r2 r3]" {
			t.Errorf("Session %s played %v, want [r1 r2 r3]", session, got)
		}
		if c := p.Calls(session); c != perSession*callsEach {
			t.Errorf("Calls(%s) = %d, want %d", session, c, perSession*callsEach)
		}
	}
}

func TestRetriesCountAsRequests(t *testing.T) {
	p := mustParse(t, `{"requests": [
		{"steps": [{"error": {"status": "timeout", "message": "500"}}]},
		{"steps": [{"text": "ok"}]}]}`)
	if _, _, err := run(t, p, newReq("s")); statusOf(err) != omni.StatusTimeout {
		t.Fatalf("first call: err = %v, want timeout", err)
	}
	got, _, err := run(t, p, newReq("s"))
	if err != nil || joinBlocks(got)[0] != "ok" {
		t.Fatalf("retry: got %v, %v; want ok", joinBlocks(got), err)
	}
}

func TestCancelDuringDelayReturnsPromptly(t *testing.T) {
	for _, steps := range []string{
		`[{"delay_ms": 60000}]`,
		`[{"text": "abcdef", "chunks": 3, "delay_ms": 60000}]`,
		`[{"text": "fast"}, {"text": "abcdef", "chunks": 3, "delay_ms": 60000}]`,
		`[{"parallel_tool_calls": [{"name": "a", "delay_ms": 60000}], "interleave": true}]`,
		`[{"error": {"status": "failed"}, "delay_ms": 60000}]`,
	} {
		t.Run(steps, func(t *testing.T) {
			p := mustParse(t, `{"requests": [{"steps": `+steps+`}]}`)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := p.Stream(ctx, newReq("s"), func(model.Delta) error { return nil })
				done <- err
			}()
			time.AfterFunc(30*time.Millisecond, cancel)
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("err = %v, want context.Canceled", err)
				}
				if el := time.Since(start); el > 5*time.Second {
					t.Errorf("returned after %v, want promptly", el)
				}
				if model.StatusOf(err) != omni.StatusAborted {
					t.Errorf("StatusOf = %s, want aborted", model.StatusOf(err))
				}
			case <-time.After(testTimeout):
				t.Fatal("Stream did not return after cancel")
			}
		})
	}
}

func TestCancelledContextEmitsNothing(t *testing.T) {
	p := mustParse(t, `{"requests": [{"steps": [{"text": "x"}]}]}`)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	n := 0
	_, err := p.Stream(ctx, newReq("s"), func(model.Delta) error { n++; return nil })
	if !errors.Is(err, context.Canceled) || n != 0 {
		t.Errorf("Stream with a cancelled ctx: %d deltas, err %v; want 0, context.Canceled", n, err)
	}
}

func TestDelaySlowsTheStream(t *testing.T) {
	p := mustParse(t, `{"requests": [{"steps": [{"text": "abcd", "chunks": 4, "delay_ms": 20}]}]}`)
	start := time.Now()
	var gaps []time.Duration
	last := start
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	_, err := p.Stream(ctx, newReq("s"), func(model.Delta) error {
		gaps = append(gaps, time.Since(last))
		last = time.Now()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gaps {
		if g < 20*time.Millisecond {
			t.Errorf("gap before delta %d = %v, want >= 20ms", i, g)
		}
	}
}

func TestEmitErrorStopsTheStream(t *testing.T) {
	p := mustParse(t, `{"requests": [{"steps": [{"text": "abcdef", "chunks": 3}, {"text": "more"}]}]}`)
	stop := errors.New("subscriber gone")
	n := 0
	_, err := p.Stream(t.Context(), newReq("s"), func(model.Delta) error {
		n++
		if n == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 2 {
		t.Errorf("after emit fails: %d deltas, err %v; want 2, %v", n, err, stop)
	}
}

func TestAfterLast(t *testing.T) {
	tests := []struct {
		name      string
		script    string
		want      []string // text of block 0 of calls 1..n, or "error: <status>"
		wantInErr string
	}{
		{
			name:      "fail by default",
			script:    `{"requests": [{"steps": [{"text": "a"}]}, {"steps": [{"text": "b"}]}]}`,
			want:      []string{"a", "b", "error: failed", "error: failed"},
			wantInErr: "test.json: script exhausted after 2 requests",
		},
		{
			name:   "repeat_last",
			script: `{"requests": [{"steps": [{"text": "a"}]}, {"steps": [{"text": "b"}]}], "after_last": "repeat_last"}`,
			want:   []string{"a", "b", "b", "b"},
		},
		{
			name:   "final_text default",
			script: `{"requests": [{"steps": [{"text": "a"}]}], "after_last": "final_text"}`,
			want:   []string{"a", "Done.", "Done."},
		},
		{
			name:   "final_text custom with no requests",
			script: `{"requests": [], "after_last": "final_text", "final_text": "bye"}`,
			want:   []string{"bye", "bye"},
		},
		{
			name:      "empty script fails at once",
			script:    `{"requests": []}`,
			want:      []string{"error: failed"},
			wantInErr: "script exhausted after 0 requests",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustParse(t, tt.script)
			for i, want := range tt.want {
				got, _, err := run(t, p, newReq("s"))
				g := joinBlocks(got)[0]
				if err != nil {
					g = "error: " + statusOf(err)
					if !strings.Contains(err.Error(), tt.wantInErr) {
						t.Errorf("call %d: error %q does not contain %q", i+1, err, tt.wantInErr)
					}
				}
				if g != want {
					t.Errorf("call %d = %q, want %q", i+1, g, want)
				}
			}
		})
	}
}

func TestExpectMatchers(t *testing.T) {
	ls := omni.ToolCall("exec_command", `{"cmd":"ls"}`, "call_a")
	tests := []struct {
		name      string
		expect    string
		msgs      []omni.Message
		wantInErr string // "" when the request must pass
	}{
		{
			name:   "last user text contains",
			expect: `"expect_last_user": "list the files"`,
			msgs:   []omni.Message{omni.UserText("please list the files here")},
		},
		{
			name:      "last user text differs",
			expect:    `"expect_last_user": "list the files"`,
			msgs:      []omni.Message{omni.UserText("list the files"), omni.Text(omni.RoleAssistant, "ok"), omni.UserText("something else")},
			wantInErr: `expect_last_user "list the files": the last user message is "something else"`,
		},
		{
			name:   "last user is a tool output",
			expect: `"expect_last_user": "README"`,
			msgs:   []omni.Message{omni.UserText("go"), ls, omni.ToolCallOutput("call_a", "README.md\nmain.go", "")},
		},
		{
			name:      "no user message at all",
			expect:    `"expect_last_user": "x"`,
			wantInErr: "the request has no user text or tool output",
		},
		{
			name:   "tool outputs in call order",
			expect: `"expect_tool_outputs": ["call_a", "call_b"]`,
			msgs: []omni.Message{omni.UserText("go"), ls, omni.ToolCall("exec_command", `{}`, "call_b"),
				omni.ToolCallOutput("call_a", "A", ""), omni.ToolCallOutput("call_b", "B", ""), omni.UserText(omni.Block(omni.TagUserSteering, "hurry"))},
		},
		{
			name:   "tool outputs in the wrong order",
			expect: `"expect_tool_outputs": ["call_a", "call_b"]`,
			msgs: []omni.Message{omni.UserText("go"), ls, omni.ToolCall("exec_command", `{}`, "call_b"),
				omni.ToolCallOutput("call_b", "B", ""), omni.ToolCallOutput("call_a", "A", "")},
			wantInErr: `expect_tool_outputs ["call_a", "call_b"]: the tool outputs after the last assistant message are ["call_b", "call_a"]`,
		},
		{
			name:   "only outputs after the last assistant message count",
			expect: `"expect_tool_outputs": ["call_c"]`,
			msgs: []omni.Message{omni.UserText("go"), ls, omni.ToolCallOutput("call_a", "A", ""),
				omni.ToolCall("x", `{}`, "call_c"), omni.ToolCallOutput("call_c", "C", "")},
		},
		{
			name:   "empty list expects no outputs",
			expect: `"expect_tool_outputs": []`,
			msgs:   []omni.Message{omni.UserText("go")},
		},
		{
			name:      "empty list with outputs",
			expect:    `"expect_tool_outputs": []`,
			msgs:      []omni.Message{omni.UserText("go"), ls, omni.ToolCallOutput("call_a", "A", "")},
			wantInErr: `expect_tool_outputs []: the tool outputs after the last assistant message are ["call_a"]`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustParse(t, `{"requests": [{`+tt.expect+`, "steps": [{"text": "ok"}]}]}`)
			got, _, err := run(t, p, newReq("s7", tt.msgs...))
			if tt.wantInErr == "" {
				if err != nil || len(p.Mismatches()) != 0 {
					t.Fatalf("err = %v, mismatches %v; want success", err, p.Mismatches())
				}
				return
			}
			if statusOf(err) != omni.StatusFailed || !strings.Contains(err.Error(), tt.wantInErr) {
				t.Fatalf("err = %v, want failed containing %q", err, tt.wantInErr)
			}
			if !strings.Contains(err.Error(), `test.json: requests[0] (request 1 of Session "s7")`) {
				t.Errorf("err = %v, want it to name the script entry and Session", err)
			}
			if len(got) != 0 {
				t.Errorf("a failed matcher streamed %d deltas, want none", len(got))
			}
			if m := p.Mismatches(); len(m) != 1 || m[0].Error() != err.Error() {
				t.Errorf("Mismatches = %v, want [%v]", m, err)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	p := mustParse(t, `{"requests": [
		{"steps": [{"text": "12345678"}], "usage": {"cache_read": 3, "output": 12, "total": 340}},
		{"steps": [{"text": "12345678"}]},
		{"steps": [{"text": "12345678"}]}]}`)
	_, res, _ := run(t, p, newReq("s", omni.UserText("hi")))
	if want := (omni.Usage{CacheRead: 3, Output: 12, Total: 340}); res.Usage != want {
		t.Errorf("scripted usage = %+v, want %+v", res.Usage, want)
	}
	small := newReq("s", omni.UserText("hi"))
	_, res1, _ := run(t, p, small)
	// "hi" = 2 chars -> 1 token; output "12345678" = 8 chars -> 2 tokens.
	if want := (omni.Usage{Output: 2, Total: 3}); res1.Usage != want {
		t.Errorf("estimated usage = %+v, want %+v", res1.Usage, want)
	}
	big := newReq("s", omni.UserText("hi"), omni.Text(omni.RoleAssistant, strings.Repeat("x", 400)),
		omni.ToolCall("read_file", `{"file_path":"a"}`, "c1"), omni.ToolCallOutput("c1", strings.Repeat("y", 4000), ""))
	big.SystemPrompt = "You are a helpful agent."
	big.Tools = []omni.ToolSpec{{Name: "read_file", Description: "Read a file.", Parameters: raw(`{"type":"object"}`)}}
	_, res2, _ := run(t, p, big)
	if res2.Usage.Output != 2 || res2.Usage.Total < res1.Usage.Total+1100 {
		t.Errorf("usage with a larger context = %+v, want output 2 and total grown by >= 1100 over %+v", res2.Usage, res1.Usage)
	}
}

func TestInfo(t *testing.T) {
	if got, want := mustParse(t, `{"requests": []}`).Info(), (model.Info{Provider: "scripted", ModelID: "test.json", ContextWindow: 128000}); got != want {
		t.Errorf("Info() = %+v, want %+v", got, want)
	}
	if got := mustParse(t, `{"context_window": 4000, "requests": []}`).Info().ContextWindow; got != 4000 {
		t.Errorf("ContextWindow = %d, want 4000", got)
	}
	if got, want := Demo().Info(), (model.Info{Provider: "scripted", ModelID: "demo", ContextWindow: 128000}); got != want {
		t.Errorf("Demo().Info() = %+v, want %+v", got, want)
	}
}

func TestNilIDsUsesASessionAllocator(t *testing.T) {
	p := mustParse(t, `{"requests": [{"steps": [{"tool_call": {"name": "x"}}, {"tool_call": {"name": "y", "id": "mine"}}]}], "after_last": "repeat_last"}`)
	var ids []string
	for range 2 {
		got, _, err := run(t, p, &model.Request{SessionID: "s"})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range got {
			if d.ToolCallID != "" {
				ids = append(ids, d.ToolCallID)
			}
		}
	}
	if want := []string{"call_1", "mine", "call_2", "call_3"}; strings.Join(ids, ",") != strings.Join(want, ",") {
		t.Errorf("ids = %v, want %v", ids, want)
	}
}

func TestOpenAndLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "script.json")
	if err := os.WriteFile(path, []byte(`{"requests": [{"steps": [{"text": "from file"}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	if p.Info().ModelID != path {
		t.Errorf("ModelID = %q, want %q", p.Info().ModelID, path)
	}
	got, _, err := run(t, p, newReq("s"))
	if err != nil || joinBlocks(got)[0] != "from file" {
		t.Errorf("played %v, %v; want %q", joinBlocks(got), err, "from file")
	}
	if d, err := Open("demo"); err != nil || d.Info().ModelID != "demo" {
		t.Errorf(`Open("demo") = %v, %v; want the demo`, d, err)
	}
	if _, err := Open(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want os.ErrNotExist", err)
	}
	if _, err := Open(""); err == nil {
		t.Error(`Open("") succeeded, want an error`)
	}

	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("{\n  \"requests\": [\n    {\"steps\": [{\"txt\": \"x\"}]}\n  ]\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := bad + `:3: requests[0].steps[0]: unknown step kind "txt"`
	if _, err := Load(bad); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Load(bad) = %v, want %s…", err, want)
	}
}

// The example of the package documentation is testdata/example.json, and it
// plays as documented.
func TestDocExample(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(doc), "// A full example:\n")
	example, _, _ := strings.Cut(after, "// Top-level fields:")
	var lines []string
	for line := range strings.Lines(example) {
		lines = append(lines, strings.TrimPrefix(strings.TrimPrefix(strings.TrimSuffix(line, "\n"), "//"), "\t"))
	}
	file, err := os.ReadFile("testdata/example.json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(strings.Join(lines, "\n")) != strings.TrimSpace(string(file)) {
		t.Errorf("the doc example and testdata/example.json differ; keep them equal")
	}

	p, err := Load("testdata/example.json")
	if err != nil {
		t.Fatalf("Load(example): %v", err)
	}
	if p.Info().ContextWindow != 200000 {
		t.Errorf("ContextWindow = %d, want 200000", p.Info().ContextWindow)
	}
	// 1: thinking, text, two tool calls.
	got, res, err := run(t, p, newReq("s", omni.UserText("please list the files")))
	if err != nil {
		t.Fatalf("request 1: %v", err)
	}
	checkDiscipline(t, got)
	b := joinBlocks(got)
	if b[0] != "Let me look around." || b[1] != "I will run two tools." ||
		b[2] != `{"description":"slow","cmd":"sleep 0.4; echo A"}` || b[3] != `{"description":"fast","cmd":"echo B"}` {
		t.Errorf("request 1 blocks = %v", b)
	}
	if res.Usage != (omni.Usage{Output: 12, Total: 340}) {
		t.Errorf("request 1 usage = %+v", res.Usage)
	}
	// 2: checks the outputs, then interleaves two calls.
	ctx := []omni.Message{omni.UserText("please list the files"),
		omni.ToolCall("exec_command", b[2], "call_a"), omni.ToolCall("exec_command", b[3], "call_b"),
		omni.ToolCallOutput("call_a", "A\n", ""), omni.ToolCallOutput("call_b", "B\n", "")}
	got, _, err = run(t, p, newReq("s", ctx...))
	if err != nil {
		t.Fatalf("request 2: %v", err)
	}
	checkDiscipline(t, got)
	var order []int
	for _, d := range got {
		order = append(order, d.Block)
	}
	if want := "[0 0 1 2 1 2 1 1 2]"; fmt.Sprint(order) != want {
		t.Errorf("request 2 block order = %v, want %s", order, want)
	}
	// 3: half a text, then a timeout.
	got, _, err = run(t, p, newReq("s", ctx...))
	if statusOf(err) != omni.StatusTimeout || len(got) != 1 || got[0].End {
		t.Errorf("request 3 = %s, %v; want one open delta and a timeout", fmtDeltas(got), err)
	}
	// 4, then after_last final_text.
	for _, want := range []string{"Done.", "Nothing more to say.", "Nothing more to say."} {
		got, _, err = run(t, p, newReq("s", ctx...))
		if err != nil || joinBlocks(got)[0] != want {
			t.Errorf("got %q, %v; want %q", joinBlocks(got)[0], err, want)
		}
	}
}

func TestLoadRefusesNonRegularAndLargeFilesBeforeReading(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.json")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil { // sparse: 2 GiB without the disk
		t.Fatal(err)
	}
	f.Close()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root:$6$SECRETHASH:19000:0:99999:7:::\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		want error
	}{
		{"/dev/zero", ErrNotRegular},
		{fifo, ErrNotRegular}, // would block forever if opened for reading
		{dir, ErrNotRegular},
		{big, ErrTooLarge},
	}
	for _, tt := range tests {
		done := make(chan error, 1)
		go func() { _, err := Open(tt.path); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, tt.want) {
				t.Errorf("Open(%s) = %v, want %v", tt.path, err, tt.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Open(%s) blocked", tt.path)
		}
	}
	_, err = Open(secret)
	if err == nil || strings.Contains(err.Error(), "root") || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("Open(non-JSON file) = %v, want an error that quotes none of the file", err)
	}
}

func TestModelCPUCountsTheEstimate(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the thread CPU clock is read on Linux only")
	}
	p := mustParse(t, `{"requests": [{"steps": [{"text": "ok"}]}], "after_last": "repeat_last"}`)
	msgs := make([]omni.Message, 0, 2000)
	for i := range 1000 {
		msgs = append(msgs, omni.UserText(fmt.Sprintf("question %d", i)), omni.Text(omni.RoleAssistant, strings.Repeat("é", 200)))
	}
	before, wall := ModelCPU(), ModelTime()
	_, res, _ := run(t, p, newReq("s", msgs...))
	if res.Usage.Total == 0 {
		t.Fatalf("usage = %+v, want an estimate", res.Usage)
	}
	if after := ModelCPU(); after <= before {
		t.Errorf("ModelCPU after estimating 2,000 messages = %v, want more than %v", after, before)
	}
	if after := ModelTime(); after <= wall {
		t.Errorf("ModelTime after estimating 2,000 messages = %v, want more than %v", after, wall)
	}
}
