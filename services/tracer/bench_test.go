package tracer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/tracer"
	tt "floe.dev/services/tracer/internal/tracertest"
)

// BenchmarkTrace100k measures the whole tracer: 100k small records (about
// 150 bytes each, interleaved over 100 Sessions or all in one) stored in
// FLOE_SESSIONS before the timer starts, traced by a fresh consumer into a
// fresh home per iteration (fetch, decode, append, positions, acks), until
// the consumer's ack floor reaches the last record. Run with -benchtime=1x
// or a few x.
func BenchmarkTrace100k(b *testing.B) {
	for _, sessions := range []int{100, 1} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) { benchTrace(b, sessions, 100000/sessions) })
	}
}

// BenchmarkTraceManySessions is the tracer as a day's Sessions accumulate:
// 100k records over 100 Sessions, against the same 100k records over 10 000
// Sessions created that day (10 records each, one Session after another, as
// they are created through a day), every Session starting with its
// session_meta and with a partial beside every record (the stream carries
// more than the Trace classes). Records are published while the tracer
// runs; the rate is from the first publish until the ack floor reaches the
// last record. The two rates should be close: nothing per record or per
// new Session may grow with the day's Sessions.
func BenchmarkTraceManySessions(b *testing.B) {
	for _, sessions := range []int{100, 10000} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) {
			for b.Loop() {
				rate, cpu := tt.TraceRate(b, sessions, 100000/sessions, sessions <= 100)
				b.ReportMetric(rate, "records/s")
				b.ReportMetric(cpu, "cpu-µs/record")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

func benchTrace(b *testing.B, sessions, perSession int) {
	env := bustest.Start(b, bus.Config{})
	items := make([]tt.Item, 0, sessions*perSession)
	text := strings.Repeat("lorem ipsum ", 5)
	for r := 0; r < perSession; r++ {
		for s := 0; s < sessions; s++ {
			id := fmt.Sprintf("session-2026-11-29-20-10-22-%08x", s)
			items = append(items, tt.Msg(b, id, omni.UserText(text)))
		}
	}
	tt.PublishAsync(b, env.JS, items...)
	ctx := context.Background()
	stream, err := env.JS.Stream(ctx, omni.SessionsStream)
	if err != nil {
		b.Fatal(err)
	}
	last := stream.CachedInfo().State.LastSeq

	i := 0
	var total, cpu time.Duration
	for b.Loop() {
		i++
		cfg := tracer.DefaultConfig()
		cfg.Home = b.TempDir()
		cfg.Durable = fmt.Sprintf("bench-%d", i)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		began, cpuBegan := time.Now(), tt.CPUTime()
		go func() { done <- tracer.Run(rctx, env.Conn, cfg, zerolog.Nop()) }()
		bustest.Eventually(b, 5*time.Minute, "all records traced", func() bool {
			c, err := env.JS.Consumer(ctx, omni.SessionsStream, cfg.Durable)
			if err != nil {
				return false
			}
			info, err := c.Info(ctx)
			return err == nil && info.AckFloor.Stream >= last
		})
		total += time.Since(began)
		cpu += tt.CPUTime() - cpuBegan
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	records := float64(sessions * perSession * i)
	b.ReportMetric(records/total.Seconds(), "records/s")
	// CPU of the whole process (tracer and embedded nats-server), which
	// says more than wall time on a busy machine.
	b.ReportMetric(float64(cpu.Microseconds())/records, "cpu-µs/record")
}
