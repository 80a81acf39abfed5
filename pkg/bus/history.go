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
	return historyFrom(ctx, js, sessionID, 0, nil, 0, 0)
}

// historyFrom appends the Session's Trace-class messages from startSeq to
// msgs; lastSeq starts at prevSeq and bad at prevBad.
func historyFrom(ctx context.Context, js jetstream.JetStream, sessionID string, startSeq uint64, msgs []omni.Message, prevSeq uint64, prevBad int) ([]omni.Message, uint64, int, error) {
	lastSeq, bad := prevSeq, prevBad
	err := Follow(ctx, js, sessionID, omni.TraceClasses, startSeq, true, func(sm StreamMsg) error {
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
		return nil, 0, bad, fmt.Errorf("bus: history of %s from seq %d: %w", sessionID, startSeq, err)
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
