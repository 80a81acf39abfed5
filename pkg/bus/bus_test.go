package bus_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// FLOE_SESSIONS takes more consumers than nats-server's default per-stream
// limit of 1000: every SSE client holds one.
func TestSessionsStreamAllowsManyConsumers(t *testing.T) {
	env := bustest.Start(t, bus.Config{Memory: true})
	ctx := context.Background()
	for i := 0; i < 1100; i++ {
		_, err := env.JS.OrderedConsumer(ctx, omni.SessionsStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{omni.SessionWildcard(fmt.Sprintf("s%d", i))},
		})
		if err != nil {
			t.Fatalf("consumer %d: %v", i, err)
		}
	}
}
