package publish_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/bus/publish"
	"floe.dev/pkg/omni"
)

// The candidates for ordered publishing, each publishing b.N partial-sized
// messages of one producer to a file-backed FLOE_SESSIONS and waiting until
// all are stored. Run: go test -run X -bench Candidates -benchtime 20000x.

func benchBody() []byte {
	p := omni.Partial(omni.TypePartialText, omni.EventDelta, "a token of text ", "", "")
	return omni.MustMarshal(&p)
}

func benchEnv(b *testing.B) (jetstream.JetStream, string) {
	env := bustest.Start(b, bus.Config{})
	return env.JS, omni.SessionSubject(sid, omni.ClassPartial)
}

// Bare async publishing (what the engine did): no order guarantee across a
// retry or an election, no detection of a lost message in the middle.
func BenchmarkCandidatesAsync(b *testing.B) {
	js, subj := benchEnv(b)
	body := benchBody()
	b.ResetTimer()
	for range b.N {
		if _, err := js.PublishAsync(subj, body, jetstream.WithRetryAttempts(0)); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
}

// Fast batch with flow control (the choice): publish.Publisher.
func BenchmarkCandidatesFastBatch(b *testing.B) {
	js, subj := benchEnv(b)
	body := benchBody()
	pub := publish.New(js, publish.Options{})
	defer pub.Close()
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		m := nats.NewMsg(subj)
		m.Data = body
		if err := pub.Publish(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pub.Settle(ctx); err != nil {
		b.Fatal(err)
	}
}

// Atomic batches of 100: stored all or nothing; one batch in flight.
func BenchmarkCandidatesAtomicBatch100(b *testing.B) {
	js, subj := benchEnv(b)
	body := benchBody()
	ctx := context.Background()
	cfg := bus.SessionsStreamConfig(bus.Config{})
	cfg.AllowAtomicPublish = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; {
		bp, err := jetstreamext.NewBatchPublisher(js)
		if err != nil {
			b.Fatal(err)
		}
		n := min(100, b.N-i)
		for k := 0; k < n-1; k++ {
			if err := bp.Add(subj, body); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := bp.Commit(ctx, subj, body); err != nil {
			b.Fatal(err)
		}
		i += n
	}
}

// Nats-Expected-Last-Subject-Sequence chaining: each message names the
// sequence of the previous one, so it needs that message's ack first (one
// round trip per message).
func BenchmarkCandidatesExpectedSequence(b *testing.B) {
	js, subj := benchEnv(b)
	body := benchBody()
	ctx := context.Background()
	var last uint64
	b.ResetTimer()
	for range b.N {
		m := nats.NewMsg(subj)
		m.Data = body
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last, 10))
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			b.Fatal(err)
		}
		last = ack.Sequence
	}
}
