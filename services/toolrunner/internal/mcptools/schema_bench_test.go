package mcptools

import (
	"encoding/json"
	"testing"

	"floe.dev/services/toolrunner/internal/argschema"
)

// BenchmarkCheckArguments measures validating one MCP call's arguments
// against the tool's compiled input schema.
func BenchmarkCheckArguments(b *testing.B) {
	s, err := argschema.Compile(json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","minLength":1},"count":{"type":"integer","minimum":0}},"required":["text"],"additionalProperties":false}`), argschema.Options{})
	if err != nil {
		b.Fatal(err)
	}
	t := &Tool{schema: s}
	for _, bc := range []struct{ name, args string }{
		{"valid", `{"text": "hello", "count": 3}`},
		{"invalid", `{"text": "", "count": -1, "x": 1}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = t.Check(bc.args)
			}
		})
	}
}
