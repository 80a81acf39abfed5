package anthropic

import (
	"testing"

	"floe.dev/pkg/sse"
	"floe.dev/services/engine/internal/model"
)

// textChunk is a typical Anthropic text delta event as it arrives on the wire.
var textChunk = []byte("event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}` + "\n\n")

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

func openTextBlock(b *testing.B) *decoder {
	d := newDecoder(&model.IDAllocator{}, discard)
	if err := d.event([]byte(textStart0)); err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkDecodeTextChunk measures one text delta event: JSON decode and
// delta emission, without SSE framing.
func BenchmarkDecodeTextChunk(b *testing.B) {
	data := []byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}`)
	d := openTextBlock(b)
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
	d := openTextBlock(b)
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
