package bus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus/retry"
)

// TailOptions tunes Tail. The zero value is the default.
type TailOptions struct {
	// Heartbeat is the idle heartbeat asked of the server for each pull;
	// two missed ones replace the consumer (default 1 s).
	Heartbeat time.Duration
	// CreateTimeout bounds each consumer creation (default 2 s).
	CreateTimeout time.Duration
	// OnError, when set, is told of every error of the consumer or of a
	// replacement, and whether the consumer is being replaced for it.
	OnError func(err error, replacing bool)
	// inactive is each consumer's inactivity threshold: how long the
	// server keeps it after its reader vanished (default 5 min).
	inactive time.Duration
}

// Tail reads a stream's messages on subjects from startSeq on, in stream
// order, each once, handing them to fn until Stop. It is an ordered
// consumer that survives the loss of the server its consumer lives on.
//
// Like nats.go's ordered consumer it uses an ephemeral, unacknowledged,
// R1 memory consumer and replaces it, from the sequence after the last
// message handed to fn, when it misses two heartbeats, is deleted, or
// delivers out of order. Unlike it, it never waits long on one creation.
// nats.go's reset retries the creation of one consumer, under one name,
// with 10 s timeouts and a backoff growing to 10 s, holding the consumer's
// lock and reporting nothing until it succeeds. Right after a kill -9 the
// dead server still looks alive to the meta leader (for about 3 s; it is
// marked offline only minutes later), so a consumer can be placed on it,
// and a reset then went unanswered for minutes
// (TestTailSurvivesTheLossOfItsConsumersServer, with nats.go's ordered
// consumer: one run in three silent for more than 90 s). Here each
// creation is a new consumer with a new name, bounded by CreateTimeout and
// retried after at most 2 s, and the heartbeat is 1 s instead of 5 s.
//
// fn runs on the consumer's delivery goroutine, one message at a time,
// without Tail's lock: it may block (until StartTail has returned, say),
// but it must not call Stop, and a slow fn holds up the delivery. Calling
// fn with the lock held deadlocked a first delivery that waited for its
// reader against StartTail taking the lock after Consume
// (TestTailHandsOverWithoutItsLock).
type Tail struct {
	js       jetstream.JetStream
	stream   string
	subjects []string
	o        TailOptions
	fn       func(jetstream.Msg)

	cancel context.CancelFunc // ends the Stop scope handed to loop
	kick   chan int           // a generation to replace
	exited chan struct{}      // loop has returned

	// pendingAtStart is how many messages the first consumer had to
	// deliver when it was created (set before StartTail returns).
	pendingAtStart uint64

	// delivering is held for each call of fn (outside mu), so fn's calls
	// never overlap, even across two consumers' generations, and stop
	// can wait for the one in progress.
	delivering sync.Mutex

	mu   sync.Mutex
	gen  int    // the current consumer's generation; others' deliveries are dropped
	next uint64 // the stream sequence after the last message handed to fn
	dseq uint64 // the current consumer's last delivery sequence
	cons jetstream.Consumer
	cc   jetstream.ConsumeContext
}

// StartTail starts reading. The first consumer is created under ctx; an error
// creating it is returned. Later ones are created by Tail itself.
func StartTail(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, startSeq uint64, o TailOptions, fn func(jetstream.Msg)) (*Tail, error) {
	if o.Heartbeat <= 0 {
		o.Heartbeat = time.Second
	}
	if o.CreateTimeout <= 0 {
		o.CreateTimeout = 2 * time.Second
	}
	if o.inactive <= 0 {
		o.inactive = 5 * time.Minute
	}
	t := &Tail{js: js, stream: stream, subjects: subjects, o: o, fn: fn,
		kick: make(chan int, 1), exited: make(chan struct{}), next: max(startSeq, 1)}
	if err := t.create(ctx, 0); err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.pendingAtStart = t.cons.CachedInfo().NumPending
	t.mu.Unlock()
	// The Stop scope: it bounds the replacements' creations and ends loop.
	stopped, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	go t.loop(stopped)
	return t, nil
}

// drained reports whether the consumer has nothing left for fn: none
// pending on the server, and every message it delivered accepted and
// handed over (no delivery in progress). Messages purged before they were
// delivered leave the pending count without a delivery, so a reader
// waiting for the one that leaves none pending would wait for ever. (A
// purge moves the consumer's delivered stream sequence forward, not its
// delivery count, which is what is compared.)
func (t *Tail) drained(ctx context.Context) (bool, error) {
	if !t.delivering.TryLock() {
		return false, nil // a delivery is being handed over
	}
	defer t.delivering.Unlock()
	t.mu.Lock()
	cons, dseq := t.cons, t.dseq
	t.mu.Unlock()
	if cons == nil {
		return false, nil // being replaced
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.Delivered.Consumer == dseq, nil
}

// Consumer returns the name of the consumer in use ("" while none is).
func (t *Tail) Consumer() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cons == nil {
		return ""
	}
	return t.cons.CachedInfo().Name
}

// Stop ends the reading: fn is not called once Stop has returned, and the
// consumer is deleted.
func (t *Tail) Stop() { t.stop(true) }

// stop is Stop; with wait false the consumer is deleted in the background.
func (t *Tail) stop(wait bool) {
	t.cancel()
	<-t.exited
	t.mu.Lock()
	t.gen++
	cons, cc := t.cons, t.cc
	t.cons, t.cc = nil, nil
	t.mu.Unlock()
	// A call of fn in progress ends before stop returns; later deliveries
	// see another generation and hand nothing over.
	t.delivering.Lock()
	//lint:ignore SA2001 an empty critical section: a barrier for fn
	t.delivering.Unlock()
	if cc != nil {
		cc.Stop()
		<-cc.Closed()
	}
	switch {
	case cons != nil && wait:
		DeleteConsumer(t.js, cons)
	case cons != nil:
		go DeleteConsumer(t.js, cons)
	}
}

// loop replaces the consumer when asked to, until Stop ends stopped.
func (t *Tail) loop(stopped context.Context) {
	defer close(t.exited)
	for {
		select {
		case g := <-t.kick:
			t.mu.Lock()
			current := g == t.gen
			t.mu.Unlock()
			if current {
				t.replace(stopped)
			}
		case <-stopped.Done():
			return
		}
	}
}

// replace drops the current consumer and creates another from the
// sequence after the last message handed to fn, retrying until Stop
// ends stopped.
func (t *Tail) replace(stopped context.Context) {
	t.mu.Lock()
	t.gen++
	g := t.gen
	cons, cc := t.cons, t.cc
	t.cons, t.cc = nil, nil
	t.mu.Unlock()
	if cc != nil {
		cc.Stop()
	}
	if cons != nil {
		go DeleteConsumer(t.js, cons) // its server may be gone: never wait on it
	}
	_, _ = retry.Do(stopped, retry.Exponential(100*time.Millisecond, 2*time.Second), 0, func() (struct{}, error) {
		err := t.create(stopped, g)
		if err == nil || stopped.Err() != nil {
			return struct{}{}, nil
		}
		t.report(err, true)
		return struct{}{}, err
	}, nil)
}

// create makes generation g's consumer, starting at t.next, and consumes it.
func (t *Tail) create(ctx context.Context, g int) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	t.mu.Lock()
	cfg := jetstream.ConsumerConfig{
		Name:              "tail_" + hex.EncodeToString(b[:]),
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       t.next,
		AckPolicy:         jetstream.AckNonePolicy,
		Replicas:          1,
		MemoryStorage:     true,
		InactiveThreshold: t.o.inactive,
	}
	t.mu.Unlock()
	if len(t.subjects) == 1 {
		cfg.FilterSubject = t.subjects[0]
	} else {
		cfg.FilterSubjects = t.subjects
	}
	cctx, cancel := context.WithTimeout(ctx, t.o.CreateTimeout)
	defer cancel()
	cons, err := t.js.CreateConsumer(cctx, t.stream, cfg)
	if err != nil {
		// It may have been created on a server that did not answer:
		// never used, it is dropped (or expires when that server is back).
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = t.js.DeleteConsumer(ctx, t.stream, cfg.Name)
		}()
		return fmt.Errorf("bus: tail %s: create consumer: %w", t.stream, err)
	}
	cc, err := cons.Consume(t.deliver(g),
		jetstream.PullHeartbeat(t.o.Heartbeat),
		jetstream.PullExpiry(max(30*time.Second, 4*t.o.Heartbeat)),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { t.onError(g, err) }))
	if err != nil {
		go DeleteConsumer(t.js, cons)
		return fmt.Errorf("bus: tail %s: consume: %w", t.stream, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if g != t.gen { // stopped meanwhile
		cc.Stop()
		go DeleteConsumer(t.js, cons)
		return nil
	}
	t.cons, t.cc, t.dseq = cons, cc, 0
	return nil
}

var errTailGap = errors.New("bus: tail: a delivery is missing")

// deliver hands generation g's messages to fn in order: a delivery
// sequence that does not follow the last one replaces the consumer.
func (t *Tail) deliver(g int) jetstream.MessageHandler {
	return func(msg jetstream.Msg) {
		md, err := msg.Metadata()
		t.delivering.Lock()
		defer t.delivering.Unlock()
		if t.accept(g, md, err) {
			t.fn(msg)
		}
	}
}

// accept reports whether generation g's delivery md is the next message to
// hand to fn, and moves the position past it; a gap replaces the consumer.
func (t *Tail) accept(g int, md *jetstream.MsgMetadata, err error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if g != t.gen {
		return false
	}
	if err == nil && md.Sequence.Consumer != t.dseq+1 {
		err = errTailGap
	}
	if err != nil {
		t.report(err, true)
		t.replaceLocked(g)
		return false
	}
	t.dseq = md.Sequence.Consumer
	if md.Sequence.Stream < t.next {
		return false // handed over already (a new consumer starts at next, so never)
	}
	t.next = md.Sequence.Stream + 1
	return true
}

// onError replaces generation g's consumer when err means it is lost.
func (t *Tail) onError(g int, err error) {
	lost := errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrBadRequest) ||
		errors.Is(err, nats.ErrNoResponders)
	t.report(err, lost)
	if lost {
		t.mu.Lock()
		t.replaceLocked(g)
		t.mu.Unlock()
	}
}

// replaceLocked asks the loop to replace generation g, once.
func (t *Tail) replaceLocked(g int) {
	if g != t.gen {
		return
	}
	select {
	case t.kick <- g:
	default: // a replacement is pending already
	}
}

func (t *Tail) report(err error, replacing bool) {
	if t.o.OnError != nil {
		t.o.OnError(err, replacing)
	}
}
