package omni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// testStamp is the fixed timestamp of every test message, so encodings are
// reproducible.
const testStamp = "2026-11-29T20:10:22.531Z"

type namedMsg struct {
	name string
	m    Message
}

var testSchema = json.RawMessage(`{"type":"object","properties":{"command":{"type":"string","description":"shell <command> && more"}},"required":["command"]}`)

// builderMessages returns one message of every kind the builders make.
func builderMessages() []namedMsg {
	withFidelity := Model(Payload{Type: TypeThinking, Role: RoleAssistant, Thinking: "hmm", Fidelity: json.RawMessage(`{"signature":"c2ln"}`)})
	sender := Model(Payload{Type: TypeText, Role: RoleUser, Text: "from bob", Sender: "bob"})
	maxTurns := Model(Payload{Type: TypeText, Role: RoleAssistant, Text: MaxTurnsNotice(3), StopReason: StatusFailed})
	ms := []namedMsg{
		{"session_meta", SessionMeta(Meta{SessionID: "session-2026-11-29-20-10-22-0123abcd", Provider: "anthropic", ModelID: "claude", ModelContextWindow: 200000, SystemPrompt: "be brief", Workspace: "/w"})},
		{"session_meta subagent", SessionMeta(Meta{SessionID: "session-2026-11-29-20-10-23-89abcdef", Provider: "openai", ModelID: "gpt", Source: "subagent", AgentState: "{\"k\":1}"})},
		{"user text", UserText("hello")},
		{"assistant text", Text(RoleAssistant, "hi there")},
		{"text with sender", sender},
		{"max turns notice", maxTurns},
		{"thinking", Thinking("let me think")},
		{"thinking with fidelity", withFidelity},
		{"tool_call", ToolCall("exec", `{"command":"ls -la"}`, "call_1")},
		{"tool_call_output", ToolCallOutput("call_1", "file\nlist", "")},
		{"tool_call_output failed", ToolCallOutput("call_2", "exit 1", StatusFailed)},
		{"tool_call_output empty", ToolCallOutput("call_3", "", "")},
		{"tool_call_output images", Model(Payload{Type: TypeToolCallOutput, Role: RoleUser, Output: "see", Images: json.RawMessage(`["data:image/png;base64,AAAA"]`), ToolCallID: "call_4"})},
		{"image_url", Model(Payload{Type: TypeImageURL, Role: RoleUser, ImageURL: "https://example.com/a.png?x=1&y=2"})},
		{"inline_data", Model(Payload{Type: TypeInlineData, Role: RoleUser, Data: "AAAA", MimeType: "image/png"})},
		{"inline_thinking", Model(Payload{Type: TypeInlineThinking, Role: RoleAssistant, Data: "enc", MimeType: "application/octet-stream"})},
		{"tool_list_ready", ToolListReady([]ToolSpec{{Name: "exec", Description: "Run a <shell> command && report", Parameters: testSchema}, {Name: "noop"}})},
		{"tool_list_ready empty", ToolListReady(nil)},
		{"request_begin", RequestBegin()},
		{"request_end completed", RequestEnd(StatusCompleted, "", 0, 0)},
		{"request_end failed", RequestEnd(StatusFailed, "upstream 529: overloaded", 2, 4000)},
		{"approval allow", ApprovalDecision(DecisionAllow, "call_1")},
		{"approval deny", ApprovalDecision(DecisionDeny, "call_2")},
		{"approval forbidden", ApprovalDecision(DecisionForbidden, "call_3")},
		{"token_usage", TokenUsage(Usage{1, 2, 3, 6}, Usage{0, 0, 3, 3})},
		{"compaction_begin", CompactionBegin(CompactContext, ModeSummarize, 0, 0)},
		{"compaction_end", CompactionEnd(CompactManual, ModeDiscard, StatusCompleted)},
		{"abort", Abort("user")},
		{"abort without reason", Abort("")},
		{"subagent", Subagent("session-2026-11-29-20-10-23-89abcdef")},
		{"nested text", Text(RoleAssistant, "child says").WithOrigin("session-2026-11-29-20-10-23-89abcdef")},
		{"nested twice", RequestBegin().WithOrigin("session-b").WithOrigin("session-a")},
	}
	for _, typ := range []string{TypeText, TypeThinking, TypeToolCall, TypeToolCallOutput} {
		for _, ev := range []string{EventStart, EventDelta, EventStop} {
			ms = append(ms, namedMsg{"partial " + typ + " " + ev, Partial(typ, ev, "frag", "exec", "call_9")})
		}
		ms = append(ms, namedMsg{"partial " + typ + " empty delta", Partial(typ, EventDelta, "", "", "call_9")})
	}
	for i := range ms {
		ms[i].m.Timestamp = testStamp
	}
	return ms
}

func mustMarshalT(t testing.TB, m *Message) []byte {
	t.Helper()
	b, err := Marshal(m)
	if err != nil {
		t.Fatalf("Marshal(%+v) error: %v", m.Payload, err)
	}
	return b
}

func TestBuilderMessagesRoundTripByteForByte(t *testing.T) {
	for _, tc := range builderMessages() {
		t.Run(tc.name, func(t *testing.T) {
			b1 := mustMarshalT(t, &tc.m)
			if !json.Valid(b1) {
				t.Fatalf("Marshal = %s, not valid JSON", b1)
			}
			if bytes.ContainsAny(b1, "\r\n") {
				t.Fatalf("Marshal = %q, want a single line", b1)
			}
			m2, err := Decode(b1)
			if err != nil {
				t.Fatalf("Decode(%s) error: %v", b1, err)
			}
			b2 := mustMarshalT(t, &m2)
			if !bytes.Equal(b1, b2) {
				t.Errorf("Marshal(Decode(%s)) = %s, want identical bytes", b1, b2)
			}
			checkOracle(t, b1, &m2)
		})
	}
}

// checkOracle decodes b with encoding/json and compares every known field
// that holds a string or number with what Unmarshal produced in m.
func checkOracle(t *testing.T, b []byte, m *Message) {
	t.Helper()
	var env map[string]json.RawMessage
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatalf("encoding/json rejects %s: %v", b, err)
	}
	var ts, typ string
	_ = json.Unmarshal(env["timestamp"], &ts)
	_ = json.Unmarshal(env["type"], &typ)
	if ts != m.Timestamp || typ != string(m.Type) {
		t.Errorf("envelope = (%q, %q), encoding/json says (%q, %q)", m.Timestamp, m.Type, ts, typ)
	}
	if o, ok := env["origin"]; ok {
		var origin []string
		if err := json.Unmarshal(o, &origin); err == nil && strings.Join(origin, "/") != strings.Join(m.Origin, "/") {
			t.Errorf("origin = %q, encoding/json says %q", m.Origin, origin)
		}
	}
	var payload map[string]json.RawMessage
	if _, ok := env["payload"]; !ok {
		return
	}
	if err := json.Unmarshal(env["payload"], &payload); err != nil {
		t.Fatalf("encoding/json rejects payload of %s: %v", b, err)
	}
	for i := range fields {
		f := &fields[i]
		raw, ok := payload[f.name]
		if !ok || string(raw) == "null" {
			continue
		}
		switch f.kind {
		case kString:
			var want string
			if err := json.Unmarshal(raw, &want); err != nil {
				// A payload type Floe does not know (the original's hook
				// record's object output, …) keeps such a field as an
				// unknown one, byte for byte.
				if !knownTypes[m.Payload.Type] && bytes.Equal(m.Payload.Field(f.name), raw) {
					continue
				}
				t.Errorf("encoding/json: field %q = %s: %v", f.name, raw, err)
			} else if got := *f.str(&m.Payload); got != want {
				t.Errorf("field %q = %q, encoding/json says %q", f.name, got, want)
			}
		case kInt:
			var want int64
			if err := json.Unmarshal(raw, &want); err == nil && *f.num(&m.Payload) != want {
				t.Errorf("field %q = %d, encoding/json says %d", f.name, *f.num(&m.Payload), want)
			}
		case kUsage:
			var want Usage
			if err := json.Unmarshal(raw, &want); err == nil && (*f.usage(&m.Payload) == nil || **f.usage(&m.Payload) != want) {
				t.Errorf("field %q = %+v, encoding/json says %+v", f.name, *f.usage(&m.Payload), want)
			}
		}
	}
}

func env(payload string) string {
	return `{"timestamp":"` + testStamp + `","type":"model_msg","payload":` + payload + `}`
}

func evt(payload string) string {
	return `{"timestamp":"` + testStamp + `","type":"event_msg","payload":` + payload + `}`
}

// TestUnmarshalMarshalPreservesBytes covers inputs whose exact bytes must
// survive decode→encode: they are how the original harness writes Traces.
func TestUnmarshalMarshalPreservesBytes(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"unknown payload field first", env(`{"x_trace":{"a":[1,2,{"b":null}]},"type":"text","role":"user","text":"hi"}`)},
		{"unknown payload field in the middle", env(`{"type":"text","role":"user","meta":[true,false,-1.5e3],"text":"hi"}`)},
		{"unknown payload field last", env(`{"type":"text","role":"user","text":"hi","cache_control":{"type":"ephemeral"}}`)},
		{"duplicate unknown payload fields", env(`{"type":"text","role":"user","x":1,"text":"hi","x":2}`)},
		{"unknown envelope field last", `{"timestamp":"` + testStamp + `","type":"event_msg","payload":{"type":"request_begin"},"seq":42}`},
		{"unknown envelope field first", `{"v":2,"timestamp":"` + testStamp + `","type":"event_msg","payload":{"type":"request_begin"}}`},
		{"unknown envelope field before payload", `{"timestamp":"` + testStamp + `","type":"event_msg","trace_id":"abc","payload":{"type":"request_begin"}}`},
		{"envelope keys reversed", `{"origin":["s-1"],"payload":{"type":"request_begin"},"type":"event_msg","timestamp":"` + testStamp + `"}`},
		{"payload keys reversed", env(`{"tool_call_id":"c1","arguments":"{}","name":"exec","role":"assistant","type":"tool_call"}`)},
		{"fidelity with odd spacing", env(`{"type":"thinking","role":"assistant","thinking":"t","fidelity":{ "signature" :"abc" ,	"n":[1, 2 ,{"x":"é\u00e9😀"}] }}`)},
		{"fidelity with unicode keys", env(`{"type":"text","role":"assistant","text":"t","fidelity":{"ключ":"значение","😀":"\ud83d\ude00","esc":"\/\u0041"}}`)},
		{"explicit zero attempt", evt(`{"type":"request_end","status":"failed","attempt":0,"retry_in_ms":0}`)},
		{"empty agent_state", `{"timestamp":"` + testStamp + `","type":"session_meta","payload":{"session_id":"s","provider":"","model_id":"","model_context_window":0,"system_prompt":"","workspace":"","agent_state":""}}`},
		{"empty strings", env(`{"type":"text","role":"assistant","text":"","stop_reason":"","sender":""}`)},
		{"null error_message", evt(`{"type":"request_end","status":"completed","error_message":null}`)},
		{"null fidelity and images", env(`{"type":"tool_call_output","role":"user","output":"x","images":null,"tool_call_id":"c","fidelity":null}`)},
		{"null usage", evt(`{"type":"token_usage","session":null,"request":{"cache_read":0,"cache_write":0,"output":1,"total":1}}`)},
		{"null origin", `{"timestamp":"` + testStamp + `","type":"event_msg","payload":{"type":"request_begin"},"origin":null}`},
		{"empty origin", `{"timestamp":"` + testStamp + `","type":"event_msg","payload":{"type":"request_begin"},"origin":[]}`},
		{"usage in another key order", evt(`{"type":"token_usage","session":{"total":9,"output":4,"cache_write":3,"cache_read":2},"request":{"cache_read":0,"cache_write":0,"output":1,"total":1}}`)},
		{"usage with unknown counts", evt(`{"type":"token_usage","session":{"cache_read":2,"cache_write":3,"output":4,"total":9,"input":7},"request":{"output":1}}`)},
		{"tools with schema", evt(`{"type":"tool_list_ready","tools":[{"name":"exec","description":"Run <cmd> && go","parameters":{"type":"object","properties":{}}}]}`)},
		{"canonical escapes", env(`{"type":"text","role":"user","text":"q\" b\\ n\n r\r t\t b\b f\f nul\u0000 us\u001f del` + "\x7f" + ` <>& ` + "\u2028\u2029" + ` 😀"}`)},
		{"unknown fields with escaped keys", env(`{"type":"text","role":"user","text":"a","\u00fcber":1,"x\"y":2,"a\\b":3}`)},
		{"negative and large ints", evt(`{"type":"compaction_begin","reason":"context","mode":"summarize","context":9223372036854775807,"turns":-9223372036854775808}`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m Message
			if err := Unmarshal([]byte(tc.in), &m); err != nil {
				t.Fatalf("Unmarshal(%s) error: %v", tc.in, err)
			}
			got := mustMarshalT(t, &m)
			if string(got) != tc.in {
				t.Errorf("Marshal(Unmarshal(x)) =\n%s\nwant\n%s", got, tc.in)
			}
			checkOracle(t, got, &m)
		})
	}
}

func TestUnmarshalEscapedKeysNameKnownFields(t *testing.T) {
	in := `{"timest\u0061mp":"` + testStamp + `","type":"model_msg","p\u0061yload":{"\u0074ype":"text","role":"user","t\u0065xt":"hi"}}`
	m, err := Decode([]byte(in))
	if err != nil {
		t.Fatalf("Decode(%s) error: %v", in, err)
	}
	if m.Timestamp != testStamp || m.Payload.Type != TypeText || m.Payload.Text != "hi" {
		t.Errorf("Decode(escaped keys) = %q %q %q, want the known fields set", m.Timestamp, m.Payload.Type, m.Payload.Text)
	}
	checkOracle(t, []byte(in), &m)
	want := env(`{"type":"text","role":"user","text":"hi"}`)
	if got := string(mustMarshalT(t, &m)); got != want {
		t.Errorf("Marshal(Decode(escaped keys)) = %s, want %s", got, want)
	}
}

func TestUnmarshalNullKnownFieldIsZero(t *testing.T) {
	m, err := Decode([]byte(evt(`{"type":"request_end","status":"completed","error_message":null,"attempt":null}`)))
	if err != nil {
		t.Fatalf("Decode error: %v", err)
	}
	if m.Payload.ErrorMessage != "" || m.Payload.Attempt != 0 {
		t.Errorf("Decode(null fields) = (%q, %d), want zero values", m.Payload.ErrorMessage, m.Payload.Attempt)
	}
}

func TestMarshalWritesFieldSetAfterDecodingNullOnce(t *testing.T) {
	in := evt(`{"type":"request_end","status":"failed","error_message":null}`)
	var m Message
	if err := Unmarshal([]byte(in), &m); err != nil {
		t.Fatalf("Unmarshal error: %v", err)
	}
	m.Payload.ErrorMessage = "boom"
	got := string(mustMarshalT(t, &m))
	want := evt(`{"type":"request_end","status":"failed","error_message":"boom"}`)
	if got != want {
		t.Errorf("Marshal = %s, want %s", got, want)
	}
}

func TestMarshalUsageReflectsChangesAfterDecode(t *testing.T) {
	in := evt(`{"type":"token_usage","session":{"total":9,"output":4,"cache_write":3,"cache_read":2},"request":{"output":1}}`)
	var m Message
	if err := Unmarshal([]byte(in), &m); err != nil {
		t.Fatalf("Unmarshal error: %v", err)
	}
	m.Payload.Session.Total = 10
	got := string(mustMarshalT(t, &m))
	want := evt(`{"type":"token_usage","session":{"cache_read":2,"cache_write":3,"output":4,"total":10},"request":{"output":1}}`)
	if got != want {
		t.Errorf("Marshal = %s, want %s", got, want)
	}
}

func TestMarshalOriginAddedToDecodedMessage(t *testing.T) {
	in := `{"timestamp":"` + testStamp + `","type":"event_msg","payload":{"type":"request_begin"}}`
	m, err := Decode([]byte(in))
	if err != nil {
		t.Fatalf("Decode error: %v", err)
	}
	fwd := m.WithOrigin("s-child")
	got := string(mustMarshalT(t, &fwd))
	want := `{"timestamp":"` + testStamp + `","type":"event_msg","payload":{"type":"request_begin"},"origin":["s-child"]}`
	if got != want {
		t.Errorf("Marshal(WithOrigin) = %s, want %s", got, want)
	}
	if again := string(mustMarshalT(t, &m)); again != in {
		t.Errorf("WithOrigin changed its receiver: Marshal = %s, want %s", again, in)
	}
}

func TestMarshalStrings(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // JSON encoding; empty: only the oracle applies
	}{
		{"quote and backslash", `a"b\c`, `"a\"b\\c"`},
		{"short escapes", "\n\r\t\b\f", `"\n\r\t\b\f"`},
		{"other control chars", "\x00\x01\x1f", `"\u0000\u0001\u001f"`},
		{"DEL is raw", "\x7f", "\"\x7f\""},
		{"html is not escaped", "<script>&amp;</script>", `"<script>&amp;</script>"`},
		{"line separators are raw", "a\u2028b\u2029c", "\"a\u2028b\u2029c\""},
		{"emoji", "😀👍🏽", `"😀👍🏽"`},
		{"slash is raw", "a/b", `"a/b"`},
		{"invalid byte", "a\xffb", `"a\ufffdb"`},
		{"truncated rune", "a\xe2\x82", `"a\ufffd\ufffd"`},
		{"surrogate half in UTF-8", "\xed\xa0\x80", `"\ufffd\ufffd\ufffd"`},
		{"valid U+FFFD stays raw", "\ufffd", "\"\ufffd\""},
		{"mixed", "é\x00\xc3<\"", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := string(appendString(nil, tc.in))
			if tc.want != "" && got != tc.want {
				t.Errorf("appendString(%q) = %s, want %s", tc.in, got, tc.want)
			}
			var ours, theirs string
			if err := json.Unmarshal([]byte(got), &ours); err != nil {
				t.Fatalf("appendString(%q) = %s, which encoding/json rejects: %v", tc.in, got, err)
			}
			ref, _ := json.Marshal(tc.in)
			_ = json.Unmarshal(ref, &theirs)
			if ours != theirs {
				t.Errorf("appendString(%q) decodes to %q, encoding/json round trip gives %q", tc.in, ours, theirs)
			}
			m := Text(RoleUser, tc.in)
			b := mustMarshalT(t, &m)
			m2, err := Decode(b)
			if err != nil {
				t.Fatalf("Decode(%s) error: %v", b, err)
			}
			if m2.Payload.Text != theirs {
				t.Errorf("Decode(Marshal(text %q)).Text = %q, want %q", tc.in, m2.Payload.Text, theirs)
			}
		})
	}
}

func TestUnmarshalStringsMatchEncodingJSON(t *testing.T) {
	literals := []string{
		`"plain"`, `"\u00e9\u00E9"`, `"\ud83d\ude00"`, `"\ud800"`, `"\udc00x"`, `"\ud800\u0041"`,
		`"\/\b\f\n\r\t\"\\"`, `"\u0000"`, "\"raw \xff byte\"", "\"raw \xed\xa0\x80 surrogate\"",
		"\"\u2028\"", `"<>&"`, `"\u003c\u003e\u0026"`,
	}
	for _, lit := range literals {
		var m Message
		in := env(`{"type":"text","role":"user","text":` + lit + `}`)
		if err := Unmarshal([]byte(in), &m); err != nil {
			t.Errorf("Unmarshal(text %s) error: %v", lit, err)
			continue
		}
		var want string
		if err := json.Unmarshal([]byte(lit), &want); err != nil {
			t.Fatalf("encoding/json rejects %s: %v", lit, err)
		}
		if m.Payload.Text != want {
			t.Errorf("Unmarshal(text %s).Text = %q, want %q", lit, m.Payload.Text, want)
		}
	}
}

func TestUnmarshalNonCanonicalNumbers(t *testing.T) {
	tests := []struct {
		num     string
		want    int64
		wantErr bool
	}{
		{"3", 3, false},
		{"-0", 0, false},
		{"3.0", 3, false},
		{"3e2", 300, false},
		{"1E+2", 100, false},
		{"3.5", 0, true},
		{"1e400", 0, true},
		{"9223372036854775807", 1<<63 - 1, false},
		{"9223372036854775808", 0, true},
		{"9.3e18", 0, true},
		{"-9223372036854775809", 0, true},
		{"1e19", 0, true},
	}
	for _, tc := range tests {
		var m Message
		err := Unmarshal([]byte(evt(`{"type":"request_end","status":"failed","attempt":`+tc.num+`}`)), &m)
		if tc.wantErr {
			if err == nil {
				t.Errorf("Unmarshal(attempt %s) = %d, want error", tc.num, m.Payload.Attempt)
			}
			continue
		}
		if err != nil {
			t.Errorf("Unmarshal(attempt %s) error: %v", tc.num, err)
			continue
		}
		if m.Payload.Attempt != tc.want {
			t.Errorf("Unmarshal(attempt %s) = %d, want %d", tc.num, m.Payload.Attempt, tc.want)
		}
	}
}

func TestMarshalKeepsRawValuesOnOneLine(t *testing.T) {
	m := Model(Payload{Type: TypeThinking, Role: RoleAssistant, Thinking: "t",
		Fidelity: json.RawMessage("{\n  \"signature\": \"a b\",\r\n  \"n\": [1,\n 2]\n}")})
	m.Timestamp = testStamp
	b := mustMarshalT(t, &m)
	if bytes.ContainsAny(b, "\r\n") || !json.Valid(b) {
		t.Fatalf("Marshal = %q, want valid single-line JSON", b)
	}
	multi := "{\n\"timestamp\": \"" + testStamp + "\",\n\"type\": \"model_msg\",\n\"payload\": {\"type\": \"text\",\n\"role\": \"user\", \"text\": \"x\",\n\"extra\": {\n\"a\": 1\n}},\n\"more\": [\n1\n]\n}\n"
	m2, err := Decode([]byte(multi))
	if err != nil {
		t.Fatalf("Decode(multi-line) error: %v", err)
	}
	b2 := mustMarshalT(t, &m2)
	if bytes.ContainsAny(b2, "\r\n") || !json.Valid(b2) {
		t.Fatalf("Marshal(Decode(multi-line)) = %q, want valid single-line JSON", b2)
	}
	var a, c any
	_ = json.Unmarshal([]byte(multi), &a)
	_ = json.Unmarshal(b2, &c)
	if fmt.Sprint(a) != fmt.Sprint(c) {
		t.Errorf("Marshal(Decode(multi-line)) = %v, want the same value as %v", c, a)
	}
}

func TestMarshalRejectsInvalidRawFields(t *testing.T) {
	tests := []struct {
		name string
		p    Payload
	}{
		{"fidelity", Payload{Type: TypeText, Role: RoleUser, Fidelity: json.RawMessage(`{"a":`)}},
		{"images", Payload{Type: TypeToolCallOutput, Role: RoleUser, ToolCallID: "c", Images: json.RawMessage(`[1,]`)}},
		{"tools", Payload{Type: TypeToolListReady, Tools: json.RawMessage(`nope`)}},
		{"tool parameters", ToolListReady([]ToolSpec{{Name: "x", Parameters: json.RawMessage(`{bad}`)}}).Payload},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := Message{Timestamp: testStamp, Type: KindModel, Payload: tc.p}
			if b, err := Marshal(&m); err == nil {
				t.Errorf("Marshal(invalid %s) = %s, want error", tc.name, b)
			}
			defer func() {
				if recover() == nil {
					t.Errorf("MustMarshal(invalid %s) did not panic", tc.name)
				}
			}()
			MustMarshal(&m)
		})
	}
}

func TestToolListReadyWritesSpecsAsJavaScriptWould(t *testing.T) {
	m := ToolListReady([]ToolSpec{{Name: "exec", Description: "Run <cmd> && report", Parameters: json.RawMessage("{\n  \"type\": \"object\"\n}"), Permission: "rw"}, {Name: "noop"}})
	m.Timestamp = testStamp
	got := string(mustMarshalT(t, &m))
	want := evt(`{"type":"tool_list_ready","tools":[{"name":"exec","description":"Run <cmd> && report","parameters":{"type":"object"}},{"name":"noop","description":"","parameters":null}]}`)
	if got != want {
		t.Errorf("Marshal(ToolListReady) =\n%s\nwant\n%s", got, want)
	}
	specs, err := m.Payload.ToolSpecs()
	if err != nil || len(specs) != 2 || specs[0].Description != "Run <cmd> && report" || string(specs[0].Parameters) != `{"type":"object"}` {
		t.Errorf("ToolSpecs() = %+v, %v; want the two specs back", specs, err)
	}
}

func TestUnmarshalManyUnknownFieldsRoundTrip(t *testing.T) {
	var sb strings.Builder
	sb.WriteString(`{"type":"text","role":"user","text":"x"`)
	const n = 40000 // more than fit in 15 bits
	for i := range n {
		fmt.Fprintf(&sb, `,"u%d":%d`, i, i)
	}
	sb.WriteString(`}`)
	in := env(sb.String())
	var m Message
	if err := Unmarshal([]byte(in), &m); err != nil {
		t.Fatalf("Unmarshal(%d unknown fields) error: %v", n, err)
	}
	if got := string(mustMarshalT(t, &m)); got != in {
		t.Errorf("Marshal(Unmarshal(%d unknown fields)) differs from input (len %d, want %d)", n, len(got), len(in))
	}
}

func TestUnmarshalTrailingWhitespaceIsAccepted(t *testing.T) {
	in := "  \t" + env(`{"type":"text","role":"user","text":"x"}`) + " \r\n"
	if _, err := Decode([]byte(in)); err != nil {
		t.Errorf("Decode(%q) error: %v", in, err)
	}
}

func TestUnmarshalTruncatedInputFails(t *testing.T) {
	var inputs [][]byte
	for _, tc := range builderMessages() {
		inputs = append(inputs, mustMarshalT(t, &tc.m))
	}
	inputs = append(inputs, goldenLines(t)...)
	for _, b := range inputs {
		for i := range len(b) {
			var m Message
			err := Unmarshal(b[:i], &m)
			if err == nil {
				t.Fatalf("Unmarshal(%q) succeeded, want error for a prefix of %s", b[:i], b)
			}
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Unmarshal(%q) error = %v, want it to wrap ErrSyntax", b[:i], err)
			}
		}
	}
}

func TestUnmarshalRejectsMalformedInput(t *testing.T) {
	ok := env(`{"type":"text","role":"user","text":"x"}`)
	deep := strings.Repeat("[", 300) + strings.Repeat("]", 300)
	tests := []struct {
		name    string
		in      string
		syntax  bool   // error must wrap ErrSyntax
		substr  string // error must mention this
		badJSON bool   // encoding/json must reject it too
	}{
		{"empty", "", true, "", true},
		{"only whitespace", "  \n", true, "", true},
		{"null", "null", true, "", false},
		{"array", "[]", true, "", false},
		{"string", `"x"`, true, "", false},
		{"trailing garbage", ok + "x", true, "trailing", true},
		{"second object", ok + "{}", true, "trailing", true},
		{"trailing comma", ok + ",", true, "trailing", true},
		{"missing colon", `{"timestamp" "x"}`, true, "", true},
		{"trailing comma in object", `{"timestamp":"x",}`, true, "", true},
		{"single quotes", `{'timestamp':'x'}`, true, "", true},
		{"unquoted key", `{timestamp:"x"}`, true, "", true},
		{"leading zero", env(`{"type":"text","n":01}`), true, "", true},
		{"bare minus", env(`{"type":"text","n":-}`), true, "", true},
		{"dot without digits", env(`{"type":"text","n":1.}`), true, "", true},
		{"exponent without digits", env(`{"type":"text","n":1e}`), true, "", true},
		{"plus sign", env(`{"type":"text","n":+1}`), true, "", true},
		{"bad literal", env(`{"type":"text","n":tru}`), true, "", true},
		{"NaN", env(`{"type":"text","n":NaN}`), true, "", true},
		{"bad escape", env(`{"type":"text","text":"\x"}`), true, "escape", true},
		{"short unicode escape", env(`{"type":"text","text":"\u12"}`), true, "escape", true},
		{"raw control char", env("{\"type\":\"text\",\"text\":\"a\x01b\"}"), true, "control", true},
		{"raw newline in string", env("{\"type\":\"text\",\"text\":\"a\nb\"}"), true, "control", true},
		{"array trailing comma", env(`{"type":"text","x":[1,]}`), true, "", true},
		{"array missing comma", env(`{"type":"text","x":[1 2]}`), true, "", true},
		{"deep nesting", env(`{"type":"text","fidelity":` + deep + `}`), true, "deep", false},
		{"very deep nesting", strings.Repeat(`{"a":`, 100000), true, "deep", true},
		{"duplicate payload field", env(`{"type":"text","text":"a","text":"b"}`), false, "duplicate", false},
		{"duplicate field, first null", env(`{"type":"text","text":null,"text":"b"}`), false, "duplicate", false},
		{"duplicate field, escaped key", env(`{"type":"text","text":"a","t\u0065xt":"b"}`), false, "duplicate", false},
		{"duplicate envelope field, escaped key", `{"type":"event_msg","typ\u0065":"model_msg","payload":{}}`, false, "duplicate", false},
		{"duplicate timestamp", `{"timestamp":"a","timestamp":"b","type":"event_msg","payload":{"type":"request_begin"}}`, false, "duplicate", false},
		{"duplicate payload", `{"timestamp":"a","type":"event_msg","payload":{"type":"request_begin"},"payload":{"status":"completed"}}`, false, "duplicate", false},
		{"duplicate origin", `{"timestamp":"a","type":"event_msg","payload":{"type":"request_begin"},"origin":["a"],"origin":["b"]}`, false, "duplicate", false},
		{"text is a number", env(`{"type":"text","text":5}`), false, `"text"`, false},
		{"type is a bool", env(`{"type":true}`), false, `"type"`, false},
		{"attempt is a string", evt(`{"type":"request_end","attempt":"1"}`), false, `"attempt"`, false},
		{"attempt is fractional", evt(`{"type":"request_end","attempt":1.5}`), false, `"attempt"`, false},
		{"timestamp is a number", `{"timestamp":5,"type":"event_msg","payload":{}}`, false, `"timestamp"`, false},
		{"payload is an array", `{"timestamp":"a","type":"event_msg","payload":[]}`, true, "payload", false},
		{"payload is null", `{"timestamp":"a","type":"event_msg","payload":null}`, true, "payload", false},
		{"origin is a string", `{"timestamp":"a","type":"event_msg","payload":{},"origin":"s"}`, true, "origin", false},
		{"origin holds a number", `{"timestamp":"a","type":"event_msg","payload":{},"origin":[1]}`, false, "origin", false},
		{"usage is a number", evt(`{"type":"token_usage","session":5}`), false, `"session"`, false},
		{"usage count is a string", evt(`{"type":"token_usage","session":{"total":"5"}}`), false, `"session"`, false},
		// The payload is decoded as it is scanned: malformed JSON after a
		// field of the wrong type is still reported as malformed.
		{"wrong type, then malformed", env(`{"type":"text","text":5,"x":[1 2]}`), true, "", true},
		{"unknown type, wrong type, then malformed", env(`{"type":"goal_finished","text":5,"x":[1,]}`), true, "", true},
		{"malformed after the payload", `{"timestamp":"a","type":"event_msg","payload":{"type":"request_begin"},"x":[1 2]}`, true, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m Message
			err := Unmarshal([]byte(tc.in), &m)
			if err == nil {
				t.Fatalf("Unmarshal(%.80q) succeeded, want error", tc.in)
			}
			if tc.syntax && !errors.Is(err, ErrSyntax) {
				t.Errorf("Unmarshal(%.80q) error = %v, want it to wrap ErrSyntax", tc.in, err)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Errorf("Unmarshal(%.80q) error = %v, want it to mention %q", tc.in, err, tc.substr)
			}
			if !strings.HasPrefix(err.Error(), "omni: ") {
				t.Errorf("Unmarshal(%.80q) error = %v, want an omni: prefix", tc.in, err)
			}
			if tc.badJSON && json.Valid([]byte(tc.in)) {
				t.Errorf("json.Valid(%.80q) = true, want false: the case is not malformed JSON", tc.in)
			}
		})
	}
}

func TestUnmarshalAcceptsModerateNesting(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200)
	in := env(`{"type":"text","role":"user","text":"x","fidelity":` + deep + `}`)
	var m Message
	if err := Unmarshal([]byte(in), &m); err != nil {
		t.Fatalf("Unmarshal(200 levels) error: %v", err)
	}
	if got := string(mustMarshalT(t, &m)); got != in {
		t.Errorf("Marshal(Unmarshal(200 levels)) differs from its input")
	}
}

func TestDecodeValidates(t *testing.T) {
	_, err := Decode([]byte(env(`{"type":"text","role":"system","text":"x"}`)))
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("Decode(role system) error = %v, want ErrInvalid", err)
	}
	_, err = Decode([]byte(env(`{"type":"text"`)))
	if !errors.Is(err, ErrSyntax) {
		t.Errorf("Decode(truncated) error = %v, want ErrSyntax", err)
	}
}

func TestUnmarshalResetsTheMessage(t *testing.T) {
	m := Text(RoleUser, "old").WithOrigin("s-1")
	if err := Unmarshal([]byte(evt(`{"type":"request_begin"}`)), &m); err != nil {
		t.Fatalf("Unmarshal error: %v", err)
	}
	if m.Payload.Text != "" || m.Origin != nil {
		t.Errorf("Unmarshal into a used Message kept text %q, origin %q", m.Payload.Text, m.Origin)
	}
}

func TestTimestampAndTime(t *testing.T) {
	at := time.Date(2026, 11, 29, 20, 10, 22, 531_900_000, time.FixedZone("x", 3600))
	if got := Timestamp(at); got != "2026-11-29T19:10:22.531Z" {
		t.Errorf("Timestamp(%v) = %q, want 2026-11-29T19:10:22.531Z", at, got)
	}
	m := Message{Timestamp: "2026-11-29T19:10:22.531Z"}
	if got, want := m.Time(), at.Truncate(time.Millisecond).UTC(); !got.Equal(want) {
		t.Errorf("Time(%q) = %v, want %v", m.Timestamp, got, want)
	}
	m.Timestamp = "2026-11-29T20:10:22.5+01:00"
	if got, want := m.Time(), time.Date(2026, 11, 29, 19, 10, 22, 5e8, time.UTC); !got.Equal(want) {
		t.Errorf("Time(%q) = %v, want %v", m.Timestamp, got, want)
	}
	m.Timestamp = "yesterday"
	if got := m.Time(); !got.IsZero() {
		t.Errorf("Time(%q) = %v, want the zero time", m.Timestamp, got)
	}
	if ts := UserText("x").Timestamp; len(ts) != len(TimeLayout) || !strings.HasSuffix(ts, "Z") {
		t.Errorf("UserText().Timestamp = %q, want the %s layout", ts, TimeLayout)
	}
}
