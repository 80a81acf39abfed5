package openai

import (
	"testing"

	"floe.dev/pkg/sse"
	"floe.dev/services/engine/internal/model"
)

// textChunk is a typical OpenAI text delta event as it arrives on the wire.
var textChunk = []byte(`data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_fc9f1d7035","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")

// repeat is an endless reader of one chunk.
type repeat struct {
	b   []byte
	off int
}

func (r *repeat) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.b[r.off:])
		n += c
		r.off = (r.off + c) % len(r.b)
	}
	return n, nil
}

func discard(model.Delta) error { return nil }

// BenchmarkDecodeTextChunk measures one text delta chunk: JSON decode and
// delta emission, without SSE framing.
func BenchmarkDecodeTextChunk(b *testing.B) {
	data := textChunk[len("data: ") : len(textChunk)-2]
	d := newDecoder(&model.IDAllocator{}, discard)
	b.SetBytes(int64(len(textChunk)))
	b.ReportAllocs()
	for b.Loop() {
		if err := d.event(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadDecodeTextChunk adds SSE framing: one op reads one event off
// a byte stream and decodes it.
func BenchmarkReadDecodeTextChunk(b *testing.B) {
	r := sse.NewReader(&repeat{b: textChunk})
	d := newDecoder(&model.IDAllocator{}, discard)
	b.SetBytes(int64(len(textChunk)))
	b.ReportAllocs()
	for b.Loop() {
		ev, err := r.Next()
		if err != nil {
			b.Fatal(err)
		}
		if err := d.event(ev.Data); err != nil {
			b.Fatal(err)
		}
	}
}
