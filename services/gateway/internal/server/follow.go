package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// follower is one ordered consumer on some classes of a Session's subjects,
// positioned at a start sequence. Its owner calls close.
type follower struct {
	js      jetstream.JetStream
	cons    jetstream.Consumer
	it      jetstream.MessagesContext
	pending uint64 // matching messages stored at or after start when created
}

// consumerInactive is how long the server keeps an ordered consumer whose
// client vanished without deleting it.
const consumerInactive = time.Minute

func (s *Server) follow(ctx context.Context, sid string, classes []string, start uint64) (*follower, error) {
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    bus.Filters(sid, classes),
		InactiveThreshold: consumerInactive,
	}
	if start > 1 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = start
	}
	cons, err := s.js.OrderedConsumer(ctx, omni.SessionsStream, cfg)
	if err != nil {
		return nil, fmt.Errorf("create consumer for %s at %d: %w", sid, start, err)
	}
	f := &follower{js: s.js, cons: cons}
	if info := cons.CachedInfo(); info != nil {
		f.pending = info.NumPending
	}
	f.it, err = cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		bus.DeleteConsumer(f.js, cons)
		return nil, fmt.Errorf("consume %s: %w", sid, err)
	}
	return f, nil
}

// close stops delivery and deletes the server-side consumer.
func (f *follower) close() {
	f.it.Stop()
	bus.DeleteConsumer(f.js, f.cons)
}

// scan delivers the matching messages stored from start, in stream order,
// and returns once it has delivered everything stored when it started.
// created, when set, runs once the consumer exists, before any delivery; its
// error ends the scan.
func (s *Server) scan(ctx context.Context, sid string, classes []string, start uint64, created func() error, fn func(bus.StreamMsg) error) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	f, err := s.follow(ctx, sid, classes, start)
	if err != nil {
		return err
	}
	defer f.close()
	if created != nil {
		if err := created(); err != nil {
			return err
		}
	}
	if f.pending == 0 {
		return nil
	}
	stop := context.AfterFunc(ctx, f.it.Stop)
	defer stop()
	var n uint64
	for {
		m, err := f.it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return errors.New("scan: consumer closed")
			}
			return err
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		_, class, _ := omni.ParseSessionSubject(m.Subject())
		if err := fn(bus.StreamMsg{Seq: md.Sequence.Stream, Subject: m.Subject(), Class: class, Data: m.Data()}); err != nil {
			return err
		}
		n++
		if n >= f.pending || md.NumPending == 0 {
			return nil
		}
	}
}
