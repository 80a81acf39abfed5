package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// StreamMsg is one message of FLOE_SESSIONS.
type StreamMsg struct {
	Seq     uint64
	Subject string
	Class   string // subject class (meta, partial, model, …)
	Data    []byte
}

// Filters returns the subject filters of a Session's classes.
func Filters(sessionID string, classes []string) []string {
	if len(classes) == 0 {
		return []string{omni.SessionWildcard(sessionID)}
	}
	out := make([]string, len(classes))
	for i, c := range classes {
		out[i] = omni.SessionSubject(sessionID, c)
	}
	return out
}

// Follow delivers a Session's messages of the given classes (all when empty)
// from startSeq (1 or 0 = the first retained) in stream order, calling fn
// for each until ctx ends or fn returns an error. With untilCaughtUp it
// returns nil once it has delivered everything stored when it started.
// A start sequence that is no longer retained is not detected here; see
// Retained.
func Follow(ctx context.Context, js jetstream.JetStream, sessionID string, classes []string, startSeq uint64, untilCaughtUp bool, fn func(StreamMsg) error) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: Filters(sessionID, classes)}
	if startSeq > 1 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = startSeq
	}
	cons, err := js.OrderedConsumer(ctx, omni.SessionsStream, cfg)
	if err != nil {
		return fmt.Errorf("bus: follow %s: %w", sessionID, err)
	}
	// Deleted when Follow returns, however it returns (the server would
	// otherwise keep it until its inactivity threshold); in the background,
	// so a caller reading history does not wait for the round trip.
	defer func() { go DeleteConsumer(js, cons) }()
	if untilCaughtUp {
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("bus: follow %s: %w", sessionID, err)
		}
		if info.NumPending == 0 {
			return nil
		}
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("bus: follow %s: %w", sessionID, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return ctx.Err()
			}
			return fmt.Errorf("bus: follow %s: %w", sessionID, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("bus: follow %s: %w", sessionID, err)
		}
		_, class, _ := omni.ParseSessionSubject(m.Subject())
		if err := fn(StreamMsg{Seq: md.Sequence.Stream, Subject: m.Subject(), Class: class, Data: m.Data()}); err != nil {
			return err
		}
		if untilCaughtUp && md.NumPending == 0 {
			return nil
		}
	}
}

// DeleteConsumer deletes the server-side consumer behind cons (for an
// ordered consumer, its current one): stopping a consume loop does not, and
// an undeleted consumer lingers on the server until its inactivity
// threshold. Errors are ignored: the threshold still removes it.
func DeleteConsumer(js jetstream.JetStream, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	js.DeleteConsumer(ctx, info.Stream, info.Name)
}

// ErrStop may be returned by a Follow callback to end it without error.
var ErrStop = errors.New("bus: stop")

// FollowUntil is Follow that treats ErrStop from fn as a clean end.
func FollowUntil(ctx context.Context, js jetstream.JetStream, sessionID string, classes []string, startSeq uint64, untilCaughtUp bool, fn func(StreamMsg) error) error {
	err := Follow(ctx, js, sessionID, classes, startSeq, untilCaughtUp, fn)
	if errors.Is(err, ErrStop) {
		return nil
	}
	return err
}

// Retained reports whether FLOE_SESSIONS still holds sequence seq: a
// consumer created at an evicted sequence silently starts later, so replay
// must check first. A sequence deleted from the middle also counts as gone.
func Retained(ctx context.Context, stream jetstream.Stream, seq uint64) (bool, error) {
	if _, err := stream.GetMsg(ctx, seq); err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		return false, fmt.Errorf("bus: get seq %d: %w", seq, err)
	}
	return true, nil
}
