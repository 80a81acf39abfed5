package task

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/segment"
)

const benchPartials = 100_000

// consume counts the Session's messages until want arrived.
func consume(b *testing.B, js jetstream.JetStream, sid string, want int) (done <-chan struct{}) {
	ch := make(chan struct{})
	var n atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	go func() {
		defer cancel()
		defer close(ch)
		_ = bus.FollowUntil(ctx, js, sid, nil, 0, false, func(bus.StreamMsg) error {
			if n.Add(1) >= int64(want) {
				return bus.ErrStop
			}
			return nil
		})
	}()
	return ch
}

// BenchmarkEnginePathPartials: 100k text deltas through the engine's
// publish path (segmenter → OmniMessage → JSON → the Task's ordered
// publisher, a JetStream fast batch) read back by an ordered consumer, beside a bare
// JetStream async publish of the same bytes in the same run.
func BenchmarkEnginePathPartials(b *testing.B) {
	env := bustest.Start(b, bus.Config{})
	js, err := jetstream.New(env.Conn, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	deps := &Deps{NC: env.Conn, JS: js, Sessions: env.Sessions, Log: zerolog.Nop()}
	frag := "some streamed words "

	// Bare: the same encoded bytes, pre-built.
	sample := omni.Partial(omni.TypeText, omni.EventDelta, frag, "", "")
	raw := omni.MustMarshal(&sample)

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sid := "bench-engine-" + string(rune('a'+i%26))
		r := New(deps, omni.Task{ID: "t", SessionID: sid})
		r.prod.open()
		done := consume(b, js, sid, benchPartials+2)
		start := time.Now()
		seg := segment.New(func(m *omni.Message) error { r.prod.publish(m, ""); return nil }, &r.llm.ids)
		for k := 0; k < benchPartials; k++ {
			if err := seg.Add(model.Delta{Block: 0, Type: omni.TypeText, Text: frag}); err != nil {
				b.Fatal(err)
			}
		}
		_ = seg.Finish("")
		<-done
		engine := time.Since(start)
		r.prod.close()

		bareSid := "bench-bare-" + string(rune('a'+i%26))
		subject := omni.SessionSubject(bareSid, omni.ClassPartial)
		done = consume(b, js, bareSid, benchPartials)
		start = time.Now()
		for k := 0; k < benchPartials; k++ {
			if _, err := js.PublishAsync(subject, raw); err != nil {
				b.Fatal(err)
			}
		}
		<-done
		bare := time.Since(start)
		b.ReportMetric(float64(benchPartials)/engine.Seconds(), "engine-msgs/s")
		b.ReportMetric(float64(benchPartials)/bare.Seconds(), "bare-msgs/s")
		b.ReportMetric(bare.Seconds()/engine.Seconds(), "engine/bare")
	}
}
