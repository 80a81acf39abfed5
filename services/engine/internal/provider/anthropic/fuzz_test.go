package anthropic

import (
	"testing"

	"floe.dev/services/engine/internal/provider/providertest"
)

// FuzzDecode feeds arbitrary bytes as the SSE body through the real decoder
// (providertest.CheckDecode says what must hold).
func FuzzDecode(f *testing.F) {
	providertest.SeedCorpus(f)
	f.Add([]byte("data: " + msgStart + "\n\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"name\":\"x\",\"input\":{\"a\":1}}}\n\ndata: {\"type\":\"message_stop\"}\n\n"))
	f.Add([]byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"x\"}}\n\n"))
	f.Add([]byte(": c\r\ndata: {\"type\":\"ping\"}\r\n\r\ndata: {\"type\":\"message_stop\"}"))
	f.Fuzz(func(t *testing.T, body []byte) {
		providertest.CheckDecode(t, decode, body)
	})
}
