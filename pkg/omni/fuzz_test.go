package omni

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func FuzzDecode(f *testing.F) {
	for _, line := range goldenLines(f) {
		f.Add(line)
	}
	for _, tc := range builderMessages() {
		f.Add(MustMarshal(&tc.m))
	}
	for _, s := range []string{
		`{"v":2,"timestamp":"t","type":"event_msg","payload":{"type":"request_begin"},"origin":null}`,
		env(`{"type":"text","role":"user","text":"a\u0000\ud800\"","x":[{"y":null}],"fidelity":{ "a" : 1 }}`),
		evt(`{"type":"token_usage","session":{"total":9,"input":1},"request":null,"attempt":1e2}`),
		"{\n\"timestamp\": \"t\",\r\n\"payload\": {\"images\": [\n1]}}",
		evt(`{"type":"request_end","status":"fatal","error_code":"rejected","error_message":"400","attempt":1}`),
		evt(`{"type":"hook","hook":"pre_tool_use","name":"n","decision":"deny","reason":"r","output":{"a":1,"b":"c"},"tool_call_id":"c1"}`),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Message
		if err := Unmarshal(b, &m); err != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("Unmarshal(%q) succeeded, but encoding/json rejects the input", b)
		}
		valid := m.Validate() == nil
		checkOracle(t, b, &m)
		e1, err := Marshal(&m)
		if err != nil {
			t.Fatalf("Marshal(Unmarshal(%q)) error: %v", b, err)
		}
		if !json.Valid(e1) || bytes.ContainsAny(e1, "\r\n") {
			t.Fatalf("Marshal(Unmarshal(%q)) = %q, want valid single-line JSON", b, e1)
		}
		var m2 Message
		if err := Unmarshal(e1, &m2); err != nil {
			t.Fatalf("Unmarshal(%q) (a re-encoding) error: %v", e1, err)
		}
		e2, err := Marshal(&m2)
		if err != nil || !bytes.Equal(e1, e2) {
			t.Fatalf("re-encoding is not idempotent:\n%q\n%q (%v)", e1, e2, err)
		}
		if valid2 := m2.Validate() == nil; valid2 != valid {
			t.Fatalf("Validate = %v before re-encoding and %v after, for %q", valid, valid2, e1)
		}
		checkSetLater(t, &m, e1)
		// Every strict prefix of a valid encoding is malformed. Long encodings
		// are sampled so a run stays fast.
		step := 1
		if len(e1) > 512 {
			step = len(e1) / 256
		}
		for i := 0; i < len(e1); i += step {
			var p Message
			if err := Unmarshal(e1[:i], &p); !errors.Is(err, ErrSyntax) {
				t.Fatalf("Unmarshal(%q) (a strict prefix) error = %v, want ErrSyntax", e1[:i], err)
			}
		}
	})
}

// FuzzStringLiteral checks the string scanner and decoder against
// encoding/json on the inside of one string literal.
func FuzzStringLiteral(f *testing.F) {
	for _, s := range []string{
		`plain`, `\u00e9`, `\ud83d\ude00`, `\ud800`, `\udc00\ud800`, `\ud800\u0041`, `\ud800\ud800\udc00`,
		`\/\b\f\n\r\t\"\\`, "raw \xff\xed\xa0\x80 bytes", `\u12`, `\x`, "\x01", `a\`, "é😀",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, inner []byte) {
		lit := append(append([]byte{'"'}, inner...), '"')
		end, err := scanString(lit, 0)
		ours := err == nil && end == len(lit)
		var want string
		theirs := json.Unmarshal(lit, &want) == nil
		if ours != theirs {
			t.Fatalf("scanString(%q) accepts = %v, encoding/json accepts = %v", lit, ours, theirs)
		}
		if !ours {
			return
		}
		var got string
		if err := decodeStringInto(lit, &got, "f"); err != nil || got != want {
			t.Fatalf("decodeStringInto(%q) = %q, %v; encoding/json says %q", lit, got, err, want)
		}
		if enc := appendString(nil, got); !json.Valid(enc) {
			t.Fatalf("appendString(%q) = %q, not valid JSON", got, enc)
		}
	})
}

// checkSetLater checks that fields set after decoding follow the decoded
// ones, which keep their order: e1 is m's encoding.
func checkSetLater(t *testing.T, m *Message, e1 []byte) {
	t.Helper()
	envKeys, payload := objectKeys(t, e1, "payload")
	payloadKeys, _ := objectKeys(t, payload, "")
	c := *m
	wantEnv, wantPayload := envKeys, payloadKeys
	if !slices.Contains(envKeys, "origin") {
		c.Origin = []string{"child"}
		wantEnv = append(slices.Clone(envKeys), "origin")
	}
	if !slices.Contains(payloadKeys, "sender") {
		c.Payload.Sender = "s"
		wantPayload = append(slices.Clone(payloadKeys), "sender")
	}
	e3 := MustMarshal(&c)
	gotEnv, payload3 := objectKeys(t, e3, "payload")
	gotPayload, _ := objectKeys(t, payload3, "")
	if !slices.Equal(gotEnv, wantEnv) || !slices.Equal(gotPayload, wantPayload) {
		t.Fatalf("setting origin and sender on Unmarshal(%q) gives %q: keys %q / %q, want %q / %q", e1, e3, gotEnv, gotPayload, wantEnv, wantPayload)
	}
}

// objectKeys returns the keys of the JSON object b in order, and the raw
// value of key sub.
func objectKeys(t *testing.T, b []byte, sub string) (keys []string, subValue []byte) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%q is not an object: %v", b, err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("keys of %q: %v", b, err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("keys of %q: %v", b, err)
		}
		k := tok.(string)
		keys = append(keys, k)
		if k == sub {
			subValue = v
		}
	}
	return keys, subValue
}

// FuzzParseUsage checks the token count fast path against encoding/json:
// what it accepts decodes to the same counts and is exactly how Floe
// writes them.
func FuzzParseUsage(f *testing.F) {
	for _, s := range []string{
		`{"cache_read":1,"cache_write":2,"output":3,"total":6}`,
		`{"cache_read":-1,"cache_write":0,"output":9223372036854775807,"total":-9223372036854775808}`,
		`{"cache_read":01,"cache_write":2,"output":3,"total":6}`,
		`{"cache_read":1,"cache_write":2,"output":3,"total":6,"x":1}`,
		`{"cache_read":1, "cache_write":2,"output":3,"total":6}`,
		`{"cache_read":-0,"cache_write":2,"output":3,"total":6}`,
		`{"cache_read":1e2,"cache_write":2,"output":3,"total":6}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u, ok := parseUsage(b)
		if !ok {
			return
		}
		var want Usage
		if err := json.Unmarshal(b, &want); err != nil || *u != want {
			t.Fatalf("parseUsage(%q) = %+v; encoding/json says %+v, %v", b, *u, want, err)
		}
		if enc := appendUsage(nil, u); !bytes.Equal(enc, b) {
			t.Fatalf("parseUsage accepted %q, which Floe writes %q", b, enc)
		}
	})
}
