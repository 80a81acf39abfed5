package telemetry

import (
	"context"
	"crypto/sha256"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"
)

type seedKey struct{}

// WithTraceSeed makes a root span started under ctx take its trace id from
// seed (a Task id) instead of a random one. A Task that arrives with no
// trace context (floe run, a client without tracing) is then still one
// trace when another engine takes it over after a crash: both engines'
// invoke_agent spans get the same trace id. A span with a parent keeps its
// parent's trace id as always.
func WithTraceSeed(ctx context.Context, seed string) context.Context {
	if seed == "" {
		return ctx
	}
	return context.WithValue(ctx, seedKey{}, seed)
}

// SeededTraceID is the trace id WithTraceSeed gives seed's root spans.
func SeededTraceID(seed string) trace.TraceID {
	sum := sha256.Sum256([]byte("floe-trace/" + seed))
	var id trace.TraceID
	copy(id[:], sum[:16])
	return id
}

// idGenerator is the SDK's random generator but for seeded roots.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	var tid trace.TraceID
	if seed, ok := ctx.Value(seedKey{}).(string); ok {
		tid = SeededTraceID(seed)
	} else {
		for !tid.IsValid() {
			putUint64(tid[:8], rand.Uint64())
			putUint64(tid[8:], rand.Uint64())
		}
	}
	return tid, newSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return newSpanID() }

func newSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		putUint64(sid[:], rand.Uint64())
	}
	return sid
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
}
