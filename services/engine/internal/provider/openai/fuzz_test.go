package openai

import (
	"testing"

	"floe.dev/services/engine/internal/provider/providertest"
)

// FuzzDecode feeds arbitrary bytes as the SSE body through the real decoder
// (providertest.CheckDecode says what must hold).
func FuzzDecode(f *testing.F) {
	providertest.SeedCorpus(f)
	f.Add([]byte("data: " + chunkJSON(`{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}`) + "\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\",\"code\":503}}\n\n"))
	f.Add([]byte(": c\r\ndata: {}\r\n\r\ndata: [DONE]"))
	f.Fuzz(func(t *testing.T, body []byte) {
		providertest.CheckDecode(t, decode, body)
	})
}
