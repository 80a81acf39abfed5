// Package publish is the one way a message reaches FLOE_SESSIONS: every
// producer (a Task's model stream, a tool call's output, nested forwarding
// of a subagent, compaction output, server events) owns one Publisher, and
// a Publisher keeps that producer's order in the stream across a leader
// election, a client reconnect and a slow ack.
//
// It uses JetStream fast batch publishing (nats-server ≥ 2.14, the stream's
// allow_batched; client side github.com/synadia-io/orbit.go/jetstreamext):
// messages go out pipelined as one batch, the server acknowledges every
// Flow messages and stalls the publisher (back-pressure) while
// Flow × MaxOutstanding of them are unacknowledged, and with gap mode
// "fail" the server abandons the batch at the first message it did not
// store, so no later message of the producer is ever stored after a lost
// one. Nothing is retried inside a batch. A lost message is detected (an
// abandoned batch, a commit that reports fewer messages than were sent, an
// ack timeout) and makes the Publisher failed: it drops everything after
// it, and the owner's next Settle reports the failure so it can fail the
// request whose retry restores what was lost, then Resume. See README
// "Ordered publishing" for the candidates measured and why this one.
//
// The connection must not buffer publishes while it reconnects
// (nats.ReconnectBufSize(-1), as bus.ClientOptions and embed's connections
// have): a buffered batch message would be sent after the reconnect, and
// the server, which keeps a batch open for 10 s, would store it even
// though the Publisher had declared it lost after AckTimeout, after the
// owner had closed the attempt with what the stream held. New refuses a
// connection that buffers: every message fails with ErrBufferedConn.
//
// Messages with a Nats-Msg-Id (idempotent: a Task's head and input, a tool
// call's complete output) are published outside any batch, synchronously,
// after the batch before them is committed, and retried until stored or the
// deadline passes: the stream drops a duplicate, so a retry never lands
// twice.
//
// # Concurrency contract
//
// A Publisher owns one goroutine, started by New and joined by Close; it
// is the only one that touches the batch. Publish, Sync, Settle and Resume
// may be called from any goroutine; each message is queued (at most
// Options.Queue of them; Publish blocks when the queue is full) and sent in
// queue order. The open batch's ack handler (a NATS callback) only flags an
// asynchronous error; it never blocks or calls into the owner. Fence is
// called on the Publisher's goroutine before every message goes out.
package publish

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"floe.dev/pkg/bus/retry"
)

// Options tune a Publisher. Zero values take the defaults.
type Options struct {
	// Fence, when set, is asked before each message goes out; false means
	// the producer lost its lease: nothing more is sent and the Publisher
	// fails with ErrFenced.
	Fence func() bool
	// Queue bounds the messages accepted but not yet sent (default 256).
	Queue int
	// Flow is how often the server acknowledges (every Flow messages,
	// default 64); MaxOutstanding how many unacknowledged Flow windows the
	// batch may have before the Publisher waits (default 4).
	Flow           uint16
	MaxOutstanding uint16
	// AckTimeout bounds every wait for the server (first ack, stall,
	// commit), default 5 s; past it the batch counts as failed.
	AckTimeout time.Duration
	// Idle closes an open batch after this long without messages (default
	// 500 ms; the server abandons a batch idle for 10 s).
	Idle time.Duration
	// SyncDeadline bounds the retries of a message with a Nats-Msg-Id
	// (default 1 min: longer than a leader election).
	SyncDeadline time.Duration
}

func (o *Options) fill() {
	if o.Queue <= 0 {
		o.Queue = 256
	}
	if o.Flow == 0 {
		o.Flow = 64
	}
	if o.MaxOutstanding == 0 {
		o.MaxOutstanding = 4
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = 5 * time.Second
	}
	if o.Idle <= 0 {
		o.Idle = 500 * time.Millisecond
	}
	if o.SyncDeadline <= 0 {
		o.SyncDeadline = time.Minute
	}
}

// Errors.
var (
	// ErrFenced: the producer's lease is gone; nothing more is published.
	ErrFenced = errors.New("publish: lease lost; not publishing")
	// ErrClosed: the Publisher was closed.
	ErrClosed = errors.New("publish: publisher closed")
	// ErrBufferedConn: the Publisher's connection keeps publishes made
	// while it reconnects and sends them later (see the package doc).
	ErrBufferedConn = errors.New("publish: the connection buffers publishes while reconnecting; connect with nats.ReconnectBufSize(-1)")
	// ErrStale: SyncAfter's message was not sent because a message of the
	// producer was lost since the generation it names.
	ErrStale = errors.New("publish: a message this one depends on may have been lost")
)

// FailedError is the failure a Settle or Sync reports: the first message
// the stream did not (or may not have) stored, and how many were dropped
// after it.
type FailedError struct {
	Err     error
	Dropped int
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("publish: a message was not stored (%v); %d later ones dropped", e.Err, e.Dropped)
}

func (e *FailedError) Unwrap() error { return e.Err }

// Ack is what Sync reports of a stored message.
type Ack struct {
	Seq       uint64
	Duplicate bool // a Nats-Msg-Id the stream had already
}

type item struct {
	msg   *nats.Msg
	reply chan result // nil: fire and forget
	// resume clears the failure; stop ends the goroutine (msg nil).
	resume, stop bool
	// after, when conditional, is the generation the message depends on.
	after       uint64
	conditional bool
}

type result struct {
	ack Ack
	err error
}

// Publisher is one producer's ordered publisher. Create with New; Close it.
type Publisher struct {
	js   jetstream.JetStream
	o    Options
	q    chan item
	done chan struct{}

	closed atomic.Bool
	refuse error // ErrBufferedConn, or nil

	// Owned by the goroutine.
	fp      jetstreamext.FastPublisher
	sent    uint64 // messages added to the open batch
	asyncMu sync.Mutex
	asyncEr error // set by the open batch's ack handler
	// asyncGen numbers the batches opened; a handler of an earlier batch
	// (its subscription outlives a failure) is ignored: a late error of a
	// batch already counted as failed must not fail the next one.
	asyncGen uint64
	failed   *FailedError
	lastSeq  uint64

	// state is failures<<1 | failing (failed and not resumed yet).
	state atomic.Uint64
}

// New starts a Publisher on js. Its connection must have no reconnect
// buffer (nats.ReconnectBufSize(-1)); on one that buffers, every message
// fails with ErrBufferedConn.
func New(js jetstream.JetStream, o Options) *Publisher {
	o.fill()
	p := &Publisher{js: js, o: o, q: make(chan item, o.Queue), done: make(chan struct{})}
	if nc := js.Conn(); nc != nil && nc.Opts.ReconnectBufSize >= 0 {
		p.refuse = ErrBufferedConn
	}
	go p.loop()
	return p
}

// Publish queues m, blocking while the queue is full (back-pressure) or
// until ctx ends. It does not wait for the stream: a message that is not
// stored shows up at the next Settle. A Publisher that failed drops m.
func (p *Publisher) Publish(ctx context.Context, m *nats.Msg) error {
	return p.put(ctx, item{msg: m})
}

// Sync publishes m and waits until it and everything queued before it is
// stored; it reports m's sequence. After a failure (this message or an
// earlier one not stored) it returns the *FailedError and m is not stored.
func (p *Publisher) Sync(ctx context.Context, m *nats.Msg) (Ack, error) {
	return p.call(ctx, item{msg: m})
}

// call queues it with a reply channel and waits for the answer.
func (p *Publisher) call(ctx context.Context, it item) (Ack, error) {
	reply := make(chan result, 1)
	it.reply = reply
	if err := p.put(ctx, it); err != nil {
		return Ack{}, err
	}
	select {
	case r := <-reply:
		return r.ack, r.err
	case <-p.done:
		return Ack{}, ErrClosed
	case <-ctx.Done():
		return Ack{}, ctx.Err()
	}
}

// SyncAfter is Sync for a message that depends on earlier ones (an
// approval decision on its tool call): it is sent only if the producer was
// not failed when token was taken (Token, read just before the earlier
// message was queued) and lost nothing since, else it fails with ErrStale,
// even after a Resume.
func (p *Publisher) SyncAfter(ctx context.Context, m *nats.Msg, token uint64) (Ack, error) {
	return p.call(ctx, item{msg: m, after: token, conditional: true})
}

// Token names the producer's state for SyncAfter: how many losses so far
// and whether it is failed now.
func (p *Publisher) Token() uint64 { return p.state.Load() }

// Failed reports whether the producer lost a message and was not resumed.
func (p *Publisher) Failed() bool { return p.state.Load()&1 == 1 }

// Settle waits until everything queued is stored (the open batch is
// committed) and returns the stream sequence of the last message stored
// and the failure, if any, since the last Resume. The failure stays until
// Resume.
func (p *Publisher) Settle(ctx context.Context) (uint64, error) {
	a, err := p.Sync(ctx, nil)
	return a.Seq, err
}

// Resume clears a failure: messages queued after it are sent again. The
// owner calls it once it has dealt with the loss (failed the request,
// closed its open segments).
func (p *Publisher) Resume() {
	_ = p.put(context.Background(), item{resume: true})
}

// Close commits what is queued, stops the goroutine and waits for it.
// Later calls fail with ErrClosed.
func (p *Publisher) Close() {
	if p.closed.CompareAndSwap(false, true) {
		select {
		case p.q <- item{stop: true}:
		case <-p.done:
		}
	}
	<-p.done
}

func (p *Publisher) put(ctx context.Context, it item) error {
	if p.closed.Load() && !it.stop {
		return ErrClosed
	}
	select {
	case p.q <- it:
		return nil
	case <-p.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Publisher) loop() {
	defer close(p.done)
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	for {
		select {
		case it := <-p.q:
			if it.stop {
				p.commit()
				return
			}
			p.handle(it)
			if p.fp != nil {
				idle.Reset(p.o.Idle)
			}
		case <-idle.C:
			p.commit()
		}
	}
}

func (p *Publisher) handle(it item) {
	switch {
	case it.resume:
		p.failed = nil
		p.state.Store(p.state.Load() &^ 1)
		return
	case it.msg == nil: // Settle
		p.commit()
		p.answer(it, Ack{Seq: p.lastSeq})
		return
	}
	if p.failed != nil {
		p.failed.Dropped++
		p.answer(it, Ack{})
		return
	}
	if it.conditional && (it.after&1 == 1 || p.state.Load() != it.after) {
		it.reply <- result{err: ErrStale}
		return
	}
	if p.refuse != nil {
		p.fail(p.refuse)
		p.answer(it, Ack{})
		return
	}
	if p.o.Fence != nil && !p.o.Fence() {
		p.fail(ErrFenced)
		p.answer(it, Ack{})
		return
	}
	if it.msg.Header.Get(jetstream.MsgIDHeader) != "" {
		p.commit()
		if p.failed != nil {
			p.failed.Dropped++
			p.answer(it, Ack{})
			return
		}
		ack, err := p.publishIdempotent(it.msg)
		if err != nil {
			p.fail(err)
		} else {
			p.lastSeq = max(p.lastSeq, ack.Seq)
		}
		p.answer(it, ack)
		return
	}
	p.add(it.msg)
	if it.reply != nil {
		p.commit()
		p.answer(it, Ack{Seq: p.lastSeq})
	}
}

func (p *Publisher) answer(it item, a Ack) {
	if it.reply == nil {
		return
	}
	var err error
	if p.failed != nil {
		// A copy: the goroutine goes on counting what it drops in
		// p.failed while the caller reads the error.
		f := *p.failed
		err = &f
		a = Ack{}
	}
	it.reply <- result{a, err}
}

func (p *Publisher) fail(err error) {
	if p.failed == nil {
		p.failed = &FailedError{Err: err}
		p.state.Store((p.state.Load()>>1+1)<<1 | 1)
	}
	p.fp, p.sent = nil, 0
}

func (p *Publisher) asyncErr() error {
	p.asyncMu.Lock()
	defer p.asyncMu.Unlock()
	return p.asyncEr
}

// add sends one message in the open batch, opening one when needed.
func (p *Publisher) add(m *nats.Msg) {
	if p.fp == nil {
		if err := p.open(m); err != nil {
			p.fail(err)
		}
		return
	}
	if err := p.asyncErr(); err != nil {
		p.fail(err)
		return
	}
	if _, err := p.fp.AddMsg(m); err != nil {
		p.fail(err)
		return
	}
	p.sent++
}

// open starts a batch with m as its first message. A server with too many
// open batches refuses the start without storing it: that is back-pressure,
// and the start is sent again until AckTimeout.
func (p *Publisher) open(m *nats.Msg) error {
	_, err := retry.Do(context.Background(), retry.Exponential(5*time.Millisecond, 200*time.Millisecond), p.o.AckTimeout, func() (struct{}, error) {
		p.asyncMu.Lock()
		p.asyncGen++
		gen := p.asyncGen
		p.asyncEr = nil
		p.asyncMu.Unlock()
		fp, err := jetstreamext.NewFastPublisher(p.js,
			jetstreamext.FastPublishFlowControl{Flow: p.o.Flow, MaxOutstandingAcks: p.o.MaxOutstanding, AckTimeout: p.o.AckTimeout},
			jetstreamext.WithFastPublisherErrorHandler(func(err error) { p.onAsyncError(gen, err) }))
		if err != nil {
			return struct{}{}, retry.Permanent(err)
		}
		_, err = fp.AddMsg(m)
		if err == nil {
			p.fp, p.sent = fp, 1
			return struct{}{}, nil
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstreamext.JSErrCodeBatchPublishTooManyInflight {
			return struct{}{}, err // back-pressure: sent again
		}
		return struct{}{}, retry.Permanent(err)
	}, nil)
	return err
}

// onAsyncError runs on the NATS callback goroutine: it only records an
// error of batch gen, if that batch is the open one.
func (p *Publisher) onAsyncError(gen uint64, err error) {
	p.asyncMu.Lock()
	if gen == p.asyncGen && p.asyncEr == nil {
		p.asyncEr = err
	}
	p.asyncMu.Unlock()
}

// commit closes the open batch and checks that the server stored every
// message of it.
func (p *Publisher) commit() {
	if p.fp == nil {
		return
	}
	fp, sent := p.fp, p.sent
	p.fp, p.sent = nil, 0
	ctx, cancel := context.WithTimeout(context.Background(), p.o.AckTimeout)
	defer cancel()
	ack, err := fp.Close(ctx)
	if err == nil {
		err = p.asyncErr()
	}
	if err == nil && ack.BatchSize != sent {
		err = fmt.Errorf("batch committed with %d of %d messages", ack.BatchSize, sent)
	}
	if err != nil {
		p.fail(err)
		return
	}
	p.lastSeq = max(p.lastSeq, ack.Sequence)
}

// publishIdempotent publishes a message with a Nats-Msg-Id, retrying until
// it is stored or SyncDeadline passes: a retry of a stored message is a
// duplicate the stream drops.
func (p *Publisher) publishIdempotent(m *nats.Msg) (Ack, error) {
	tries := 0
	return retry.Do(context.Background(), retry.Exponential(50*time.Millisecond, 2*time.Second), p.o.SyncDeadline, func() (Ack, error) {
		// A retry after a wait checks the lease again: a stall may
		// have lost it meanwhile.
		if tries++; tries > 1 && p.o.Fence != nil && !p.o.Fence() {
			return Ack{}, retry.Permanent(ErrFenced)
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.o.AckTimeout)
		ack, err := p.js.PublishMsg(ctx, m)
		cancel()
		if err == nil {
			return Ack{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500 && apiErr.Code != 408 && apiErr.Code != 429 {
			return Ack{}, retry.Permanent(err) // the stream refused it: retrying cannot help
		}
		return Ack{}, err
	}, nil)
}
