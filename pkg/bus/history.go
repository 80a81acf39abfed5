package bus

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// History reads a Session's Trace-class messages (meta, model, event, trace)
// from FLOE_SESSIONS in stream order, from the first retained one up to the
// last stored when it was called. It returns them with the sequence of the
// last one (0 when none). Bodies that do not decode are skipped and counted
// in bad: bad input never stops a Session from loading.
func History(ctx context.Context, js jetstream.JetStream, sessionID string) (msgs []omni.Message, lastSeq uint64, bad int, err error) {
	err = Follow(ctx, js, sessionID, omni.TraceClasses, 0, true, func(sm StreamMsg) error {
		lastSeq = sm.Seq
		m, derr := omni.Decode(sm.Data)
		if derr != nil {
			bad++
			return nil
		}
		msgs = append(msgs, m)
		return nil
	})
	if err != nil {
		return nil, 0, bad, fmt.Errorf("bus: history of %s: %w", sessionID, err)
	}
	return msgs, lastSeq, bad, nil
}

// LastSeq returns the last sequence of FLOE_SESSIONS (0 when empty).
func LastSeq(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	s, err := js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return 0, fmt.Errorf("bus: stream %s: %w", omni.SessionsStream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("bus: stream %s info: %w", omni.SessionsStream, err)
	}
	return info.State.LastSeq, nil
}
