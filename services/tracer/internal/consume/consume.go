// Package consume is the tracer's intake: a durable pull consumer on
// FLOE_SESSIONS that delivers the Trace classes (meta, model, event, trace),
// whose messages it checks, appends through a tracefile.Store and
// acknowledges once their positions are recorded.
//
// # Ordering and acknowledgement
//
// The consumer uses AckAll: after a batch's records are written and their
// positions recorded, one ack of the batch's last message acknowledges the
// whole batch (one ack per batch instead of one per message, and the ack
// floor is always a point below which every record is in a Trace). That is
// only sound if no message the tracer never saw sits below an acked one,
// and, because a Trace must keep stream order, if the consumer never hands
// out a newer message before an older one it already delivered. JetStream
// breaks both when delivered messages are lost on the way (a tracer killed
// with messages in flight, a pull abandoned at shutdown, a reconnect): they
// stay pending until their ack wait expires while newer ones are delivered.
// So the loop resets the consumer to its ack floor whenever that can have
// happened: at start when the consumer has pending messages, when the pull
// reports an error (missing heartbeats, a consumer gone), after a
// reconnect, and when a delivery's consumer sequence is not the one after
// the last delivery received (nothing from it on is processed). Then
// delivery restarts from the first unacknowledged message, in order, and
// records already written are skipped by their sequence. A reset after
// deliveries is immediate; only resets in a row with nothing delivered
// back off (RetryMin doubling to RetryMax), so catching up after a leader
// change takes seconds.
//
// The pull is continuous (jetstream Consume): requests of up to Batch
// messages and BatchBytes bytes, each waiting up to FetchWait, the next
// sent as the last is used up, on one subscription. Not a Fetch per
// request: in a cluster a replicated consumer sends a delivery only once
// its replicas have it, while a request's end (Batch Completed, its time
// used up) goes out at once and can overtake its last deliveries; a Fetch
// ended there and lost them (right after a reset, with a backlog, every
// delivery of every request: the tracer stalled). Messages are processed as
// they arrive, and when none has come for a millisecond the records so far
// are committed (positions, then ack). Under load that is one commit per
// burst; when the stream trickles, each record is written at once and
// recorded a millisecond later.
//
// # Two filters
//
// Caught up, the consumer is filtered to the four Trace classes (one
// wildcard filter each): a streaming Session's partials, most of the
// stream, never reach the tracer, so a model streaming at 500 deltas a
// second costs it nothing (protocol.md §2). Behind, it takes the whole
// stream and drops the other classes itself: nats-server finds a
// multi-filter consumer's next message far from the stream's end by
// intersecting the filters with every subject of the message block, for
// each delivery (78 % of the CPU when 10,000 Sessions of a day are
// traced from a backlog, 17× the CPU per record of 100 Sessions), while
// near the end it scans the few messages in between. So Run starts on the
// whole stream, narrows the consumer once a delivery finds nothing
// pending, and widens it again when more than behindLimit Trace records
// are pending. Each switch commits what was delivered and updates the
// durable in place (its ack floor kept); filters never change a Trace.
package consume

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/services/tracer/internal/tracefile"
)

// Options configures Run. Zero values are not defaulted here; the tracer's
// Config.Validate fills them.
type Options struct {
	Home       string
	Durable    string
	Batch      int
	BatchBytes int
	FetchWait  time.Duration
	AckWait    time.Duration
	MaxOpen    int
	RetryMin   time.Duration
	RetryMax   time.Duration
	// Committed, when set, is called after each commit with the Trace
	// records it covered, the stream time of its last message and the
	// messages still pending after it (for the tracer's metrics).
	Committed func(records int, stored time.Time, pending uint64)
	// Stuck, when set, is called with the Sessions whose Trace cannot be
	// written (set aside, retried with backoff) whenever that set changes.
	Stuck func([]Stuck)
	// PositionFailed, when set, is called with the number of Sessions
	// whose position the shared position table refused in one commit.
	PositionFailed func(sessions int)

	// Hooks are for tests only.
	Hooks Hooks
}

// Hooks let tests stop the loop exactly where a kill -9 leaves the files,
// the positions and the consumer out of step. A hook that returns an error
// makes Run return that error at once: nothing more is written, recorded
// or acknowledged (files are closed, as the kernel would).
type Hooks struct {
	// AfterWrite runs when a batch's records are written, before their
	// positions are recorded; last is the stream sequence of the batch's
	// last message.
	AfterWrite func(last uint64) error
	// AfterFlush runs when the positions are recorded, before the ack.
	AfterFlush func(last uint64) error
	// NoReset makes the loop recover pending messages by deleting and
	// re-creating the consumer at its ack floor, as it does on a server
	// without the consumer reset API.
	NoReset bool
	// FailPositions, when set, makes the position writes of the Sessions
	// it returns an error for fail (a position table refusing writes).
	FailPositions func(sessionID string) error
}

// crashError is a hook's error: Run returns it without recovery.
type crashError struct{ err error }

func (e *crashError) Error() string { return "consume: stopped by hook: " + e.err.Error() }
func (e *crashError) Unwrap() error { return e.err }

// errResync ends a batch after which delivered messages may have been lost;
// the loop then resets the consumer before pulling again.
var errResync = errors.New("consume: delivery may have lost messages")

// Run traces FLOE_SESSIONS into o.Home until ctx ends, then returns nil
// after committing what it has processed. It waits for the home's tracer
// lock while another tracer holds it, retries bus and file errors with a
// capped exponential backoff, and returns early only when the lock cannot
// be taken for another reason or a test hook stops it.
func Run(ctx context.Context, nc *nats.Conn, o Options, log zerolog.Logger) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("consume: jetstream: %w", err)
	}
	store, err := openStore(ctx, o, log)
	if err != nil || store == nil {
		return err
	}
	defer store.Close()
	r := &runner{nc: nc, js: js, o: o, log: log, store: store}
	return r.run(ctx)
}

// openStore takes the home's lock, polling while another tracer holds it;
// nil without error when ctx ends first.
func openStore(ctx context.Context, o Options, log zerolog.Logger) (*tracefile.Store, error) {
	logged := false
	for {
		store, err := tracefile.Open(o.Home, o.MaxOpen, log)
		if err == nil {
			if o.Hooks.FailPositions != nil {
				store.FailPositions(o.Hooks.FailPositions)
			}
			if logged {
				log.Info().Msg("took the tracer lock")
			}
			return store, nil
		}
		if !errors.Is(err, tracefile.ErrLocked) {
			return nil, err
		}
		if !logged {
			log.Info().Str("home", o.Home).Msg("another tracer holds this home; waiting for its lock")
			logged = true
		}
		if retry.Sleep(ctx, o.RetryMax) != nil {
			return nil, nil
		}
	}
}

// runner is one Run's state; only Run's goroutine uses it.
type runner struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	o     Options
	log   zerolog.Logger
	store *tracefile.Store
	buf   []byte // a record whose newlines had to be replaced
	// appended counts the records appended since the last commit.
	appended int
	// dels delivers TraceDelete requests (a channel subscription: the
	// NATS callback goroutine never touches the Store; this goroutine
	// serves them between messages).
	dels chan *nats.Msg
	// dseq is the consumer sequence of the last delivery received since
	// the consumer was set up (0: none yet). Deliveries come numbered
	// one by one, so a jump means one never arrived (see batch).
	dseq uint64
	// stuck are the Sessions set aside (stuck.go); handled is the stream
	// sequence of the last message the loop handled, floor the consumer's
	// ack floor at setup: a catch-up reads up to the larger.
	stuck   map[string]*stuckSession
	handled uint64
	floor   uint64
	stream  jetstream.Stream // for catch-ups; looked up on first use
	// narrow is whether the consumer is filtered to the Trace classes
	// (caught up) or takes the whole stream (behind); see the package doc.
	narrow bool
}

// behindLimit is how many pending Trace records make a narrowed consumer
// take the whole stream again.
const behindLimit = 1000

// errSwitch ends a batch whose consumer should change filters; what was
// delivered is committed.
var errSwitch = errors.New("consume: switching the consumer's filters")

func (r *runner) run(ctx context.Context) error {
	r.dels = make(chan *nats.Msg, 64)
	r.stuck = map[string]*stuckSession{}
	r.loadStuck()
	sub, err := r.nc.ChanSubscribe(omni.TraceDeleteSubject("*"), r.dels)
	if err != nil {
		return fmt.Errorf("consume: subscribe to delete requests: %w", err)
	}
	defer sub.Unsubscribe()
	var cons jetstream.Consumer
	backoff := retry.Exponential(r.o.RetryMin, r.o.RetryMax)
	for ctx.Err() == nil {
		if cons == nil {
			c, err := r.setup(ctx)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				wait := backoff.NextBackOff()
				r.log.Warn().Err(err).Dur("retry_in", wait).Msg("cannot set up the tracer consumer; retrying")
				_ = retry.Sleep(ctx, wait)
				continue
			}
			cons = c
		}
		delivered, err := r.batch(ctx, cons)
		var crash *crashError
		switch {
		case err == nil:
			backoff.Reset()
		case errors.As(err, &crash):
			return err
		case ctx.Err() != nil:
		case errors.Is(err, errSwitch):
			r.narrow = !r.narrow
			r.log.Debug().Bool("narrow", r.narrow).Msg("switching the consumer's filters")
			cons = nil
			backoff.Reset()
		case errors.Is(err, errResync) && delivered > 0:
			// What was received is committed; only the consumer needs
			// setting straight, at once: it delivers. (Waiting here, longer
			// each time, made the catch-up after a leader change take
			// minutes.)
			r.log.Info().Err(err).Int("delivered", delivered).Msg("resetting the consumer to its ack floor")
			cons = nil
			backoff.Reset()
		case errors.Is(err, errResync):
			// Nothing came: back off, or a server refusing every pull
			// would be asked in a tight loop.
			wait := backoff.NextBackOff()
			r.log.Info().Err(err).Dur("retry_in", wait).Msg("resetting the consumer to its ack floor")
			cons = nil
			_ = retry.Sleep(ctx, wait)
		default:
			// The Store may hold partial writes: forget it all, as a crash
			// would, and let the redelivery rewrite from the positions.
			wait := backoff.NextBackOff()
			r.log.Error().Err(err).Dur("retry_in", wait).Msg("tracing failed; resuming from the recorded positions")
			r.store.Reset()
			cons = nil
			_ = retry.Sleep(ctx, wait)
		}
	}
	// Get the last acks to the server before the caller closes the
	// connection.
	if err := r.nc.FlushTimeout(time.Second); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		r.log.Warn().Err(err).Msg("cannot flush the last acks")
	}
	return nil
}

// consumerConfig is the durable consumer Run uses: narrowed to the Trace
// classes, one wildcard filter each, or the whole stream (see the package
// doc). A filter equal to the stream's subjects is no filter at all for
// nats-server.
func (r *runner) consumerConfig() jetstream.ConsumerConfig {
	cfg := jetstream.ConsumerConfig{
		Durable:       r.o.Durable,
		Description:   "Floe tracer: writes Session Traces",
		FilterSubject: omni.SessionSubjects,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       r.o.AckWait,
		MaxAckPending: max(1000, 4*r.o.Batch),
		MaxDeliver:    -1,
	}
	if r.narrow {
		cfg.FilterSubject = ""
		for _, class := range omni.TraceClasses {
			cfg.FilterSubjects = append(cfg.FilterSubjects, omni.SessionSubject("*", class))
		}
	}
	return cfg
}

// setup checks the stream's incarnation against the recorded positions
// (tracefile.Store.SetEpoch), creates or updates the durable consumer,
// sets the consumer sequence the next delivery must follow (r.dseq) and,
// when it has delivered-but-unacknowledged messages (a previous tracer's
// in-flight batch), resets it to its ack floor so delivery resumes in order.
func (r *runner) setup(ctx context.Context) (jetstream.Consumer, error) {
	stream, err := r.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", omni.SessionsStream, err)
	}
	epoch := stream.CachedInfo().Created.UTC().Format(time.RFC3339Nano)
	changed, err := r.store.SetEpoch(epoch)
	if err != nil {
		return nil, err
	}
	if changed {
		r.log.Warn().Str("epoch", epoch).Msg("the stream was re-created; recorded sequences cleared")
	}
	cfg := r.consumerConfig()
	if old, err := r.js.Consumer(ctx, omni.SessionsStream, r.o.Durable); err == nil {
		// Keep where it starts: a consumer re-created at its ack floor
		// starts by sequence, and that cannot be updated.
		oc := old.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = oc.DeliverPolicy, oc.OptStartSeq, oc.OptStartTime
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("look up consumer %s: %w", r.o.Durable, err)
	}
	cons, err := r.js.CreateOrUpdateConsumer(ctx, omni.SessionsStream, cfg)
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", r.o.Durable, err)
	}
	info := cons.CachedInfo()
	r.floor = info.AckFloor.Stream
	r.dseq = 0
	if info.NumAckPending == 0 {
		// Nothing in flight: the next delivery must be the one after the
		// last (a filter switch keeps the numbering), so a delivery taken
		// by someone else right now is caught by inSequence too.
		r.dseq = info.Delivered.Consumer
		return cons, nil
	}
	r.log.Info().Int("pending", info.NumAckPending).Uint64("seq", info.AckFloor.Stream).
		Msg("redelivering from the ack floor")
	if !r.o.Hooks.NoReset {
		_, err := r.js.ResetConsumer(ctx, omni.SessionsStream, r.o.Durable)
		if err == nil {
			return cons, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		r.log.Warn().Err(err).Msg("consumer reset failed; re-creating the consumer at its ack floor")
	}
	return r.recreate(ctx, cfg)
}

// recreate replaces the consumer by one starting after its ack floor: the
// reset of a server without the consumer reset API.
func (r *runner) recreate(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := r.js.Consumer(ctx, omni.SessionsStream, r.o.Durable)
	if err != nil {
		return nil, fmt.Errorf("look up consumer %s: %w", r.o.Durable, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer %s info: %w", r.o.Durable, err)
	}
	start := info.AckFloor.Stream + 1
	if info.Config.DeliverPolicy == jetstream.DeliverByStartSequencePolicy {
		start = max(start, info.Config.OptStartSeq)
	}
	if err := r.js.DeleteConsumer(ctx, omni.SessionsStream, r.o.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("delete consumer %s: %w", r.o.Durable, err)
	}
	cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartSequencePolicy, start, nil
	cons, err = r.js.CreateConsumer(ctx, omni.SessionsStream, cfg)
	if err != nil {
		return nil, fmt.Errorf("re-create consumer %s at %d: %w", r.o.Durable, start, err)
	}
	return cons, nil
}

// idleClose is how long a Session may go without a record before the
// tracer closes its Trace file and forgets it (Store.CloseIdle): an idle
// Session then holds nothing in the tracer.
const idleClose = 5 * time.Second

// commitLinger is how long the stream must pause before what was processed
// is committed. Committing as soon as no message is ready would commit every
// few messages: the loop outpaces the client's delivery.
const commitLinger = time.Millisecond

// batch consumes through one continuous pull (requests of up to Batch
// messages and BatchBytes bytes, each waiting up to FetchWait, sent as the
// last are used up) until ctx ends or a delivery may have been lost. It
// processes messages as they arrive, commits when they pause for
// commitLinger, and closes idle files every FetchWait. It returns how many
// messages it was delivered.
//
// A continuous pull rather than one Fetch per request: in a cluster a pull
// request's end (Batch Completed, its time used up) can reach the client
// before its last deliveries, which a replicated consumer sends only once
// its replicas have them. A Fetch ends there and its deliveries still on
// the way are lost to it; right after a reset, with a backlog, that was
// every delivery of every request (the tracer stalled). The continuous
// pull's subscription stays, so they arrive, in order.
func (r *runner) batch(ctx context.Context, cons jetstream.Consumer) (delivered int, err error) {
	reconnects := r.nc.Stats().Reconnects
	// The callback hands each message over and waits while the loop is
	// busy (back-pressure: no more is pulled meanwhile); it never calls
	// into the loop. Errors the pull reports (missing heartbeats, a
	// consumer gone) end the batch.
	msgs := make(chan jetstream.Msg, r.o.Batch)
	ended := make(chan error, 1)
	stop := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-stop:
		}
	}, jetstream.PullMaxMessagesWithBytesLimit(r.o.Batch, r.o.BatchBytes),
		jetstream.PullExpiry(max(r.o.FetchWait, time.Second)),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			select {
			case ended <- err:
			default:
			}
		}))
	if err != nil {
		return 0, fmt.Errorf("pull: %w", err)
	}
	defer func() {
		close(stop)
		cc.Stop()
		<-cc.Closed()
	}()

	var last jetstream.Msg // processed, not yet committed
	var lastSeq uint64
	commit := func() error {
		if last == nil {
			return nil
		}
		m := last
		last = nil
		return r.commit(m, lastSeq)
	}
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	tick := time.NewTicker(r.o.FetchWait)
	defer tick.Stop()
	for {
		select {
		case m := <-msgs:
			delivered++
			if gap := r.inSequence(m); gap != nil {
				if err := commit(); err != nil {
					return delivered, err
				}
				return delivered, gap
			}
			seq, err := r.handle(m)
			if err != nil {
				return delivered, err
			}
			last, lastSeq = m, seq
			r.handled = max(r.handled, seq)
			if r.switchFilters(m) {
				if err := commit(); err != nil {
					return delivered, err
				}
				return delivered, errSwitch
			}
			if len(msgs) == 0 {
				linger.Reset(commitLinger)
			}
		case <-linger.C:
			if err := commit(); err != nil {
				return delivered, err
			}
		case dm := <-r.dels:
			r.delete(dm)
		case <-tick.C:
			if _, err := r.store.CloseIdle(time.Now().Add(-idleClose)); err != nil {
				return delivered, err
			}
			if len(r.stuck) > 0 {
				// What the loop handled is committed first: a catch-up
				// flushes positions, and writes only up to what was handled.
				if err := commit(); err != nil {
					return delivered, err
				}
				if err := r.retryStuck(ctx); err != nil {
					return delivered, err
				}
			}
			if r.nc.Stats().Reconnects != reconnects {
				if err := commit(); err != nil {
					return delivered, err
				}
				return delivered, fmt.Errorf("%w: reconnected to NATS", errResync)
			}
		case err := <-ended:
			if cerr := commit(); cerr != nil {
				return delivered, cerr
			}
			if ctx.Err() != nil {
				return delivered, nil
			}
			return delivered, fmt.Errorf("%w: pull ended: %v", errResync, err)
		case <-ctx.Done():
			// Shutting down: what was delivered is committed.
			return delivered, commit()
		}
	}
}

// switchFilters reports whether, after m, the consumer should change
// filters: narrow once nothing is pending, wide again when more than
// behindLimit Trace records are.
func (r *runner) switchFilters(m jetstream.Msg) bool {
	md, err := m.Metadata()
	if err != nil {
		return false
	}
	if r.narrow {
		return md.NumPending > behindLimit
	}
	return md.NumPending == 0
}

// inSequence checks that m is the delivery right after the last one
// received. A delivery that never arrived stays pending on the consumer
// while later ones come, and acknowledging a later one (AckAll) would
// acknowledge it too: its record would be missing from the Trace (a
// reconnect, a slow-consumer drop, or, with one Fetch per request, a
// cluster's replicated delivery overtaken by its request's end). So a jump
// in the consumer sequence ends the batch before m: what came before is
// committed and the consumer is reset to its ack floor.
func (r *runner) inSequence(m jetstream.Msg) error {
	md, err := m.Metadata()
	if err != nil {
		return nil // handle skips it
	}
	if d := md.Sequence.Consumer; r.dseq != 0 && d != r.dseq+1 {
		return fmt.Errorf("%w: delivery %d came after %d", errResync, d, r.dseq)
	}
	r.dseq = md.Sequence.Consumer
	return nil
}

// purge purges a deleted Session's messages from FLOE_SESSIONS when req
// asks for it and returns the sequence its records are purged through.
func (r *runner) purge(sid string, req omni.TraceDelete) (uint64, error) {
	if !req.Purge {
		return req.PurgedThrough, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := r.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return 0, fmt.Errorf("purge session messages: %w", err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(omni.SessionWildcard(sid))); err != nil {
		return 0, fmt.Errorf("purge session messages: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("purge session messages: %w", err)
	}
	return info.State.LastSeq, nil
}

// delete serves one TraceDelete request (floe.tracer.delete.<sid>): it
// purges the Session's messages from the stream when asked to (the
// gateway may not), removes the Session's Trace files and position and
// replies.
func (r *runner) delete(m *nats.Msg) {
	sid := strings.TrimPrefix(m.Subject, omni.TraceDeleteSubject(""))
	var req omni.TraceDelete
	var reply omni.TraceDeleteReply
	if err := omni.Unpack(m.Data, &req); err != nil {
		reply.Error = err.Error()
	} else if !omni.ValidSessionID(sid) || strings.ContainsAny(sid, `/\`) {
		reply.Error = fmt.Sprintf("session id %q cannot name a trace file", sid)
	} else if through, err := r.purge(sid, req); err != nil {
		reply.Error = err.Error()
		r.log.Error().Err(err).Str("session_id", sid).Msg("cannot purge a deleted Session's messages")
	} else {
		n, err := r.store.Delete(sid, through)
		reply.Files = n
		if _, ok := r.stuck[sid]; ok && err == nil {
			delete(r.stuck, sid)
			r.saveStuck()
			r.reportStuck()
		}
		if err != nil {
			reply.Error = err.Error()
			r.log.Error().Err(err).Str("session_id", sid).Msg("cannot delete trace")
		} else {
			r.log.Info().Str("session_id", sid).Int("trace_files", n).Msg("trace deleted")
		}
	}
	if m.Reply == "" {
		return
	}
	b, err := omni.Pack(&reply)
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		r.log.Warn().Err(err).Str("session_id", sid).Msg("cannot answer a delete request")
	}
}

// commit records the positions of what was appended and acknowledges every
// message up to last (AckAll).
func (r *runner) commit(last jetstream.Msg, seq uint64) error {
	if h := r.o.Hooks.AfterWrite; h != nil {
		if err := h(seq); err != nil {
			return &crashError{err}
		}
	}
	if err := r.store.Flush(); err != nil {
		var failed tracefile.PositionErrors
		if !errors.As(err, &failed) {
			return err
		}
		// The shared position table refused some Sessions' positions:
		// those are set aside (caught up later with backoff, as after a
		// failed append) and the others go on; the batch is acknowledged.
		stored := time.Now()
		if md, err := last.Metadata(); err == nil {
			stored = md.Timestamp
		}
		for sid, err := range failed {
			r.stick(sid, stored, err)
		}
		if f := r.o.PositionFailed; f != nil {
			f(len(failed))
		}
	}
	if h := r.o.Hooks.AfterFlush; h != nil {
		if err := h(seq); err != nil {
			return &crashError{err}
		}
	}
	if err := last.Ack(); err != nil {
		return fmt.Errorf("ack seq %d: %w", seq, err)
	}
	r.store.Committed(seq)
	if f := r.o.Committed; f != nil {
		if md, err := last.Metadata(); err == nil {
			f(r.appended, md.Timestamp, md.NumPending)
		}
	}
	r.appended = 0
	return nil
}

// handle appends one message to its Session's Trace when it is a Trace
// record, and skips it with a log line otherwise (bad input is never
// retried: it would block the stream). A Session whose Trace cannot be
// written is set aside (stuck.go) and its records skipped here. An error
// is a file error of the batch as a whole: it must not be acknowledged.
func (r *runner) handle(m jetstream.Msg) (seq uint64, err error) {
	subject := m.Subject()
	md, err := m.Metadata()
	if err != nil {
		r.log.Warn().Err(err).Str("subject", subject).Msg("skipping message without JetStream metadata")
		return 0, nil
	}
	seq = md.Sequence.Stream
	if sid, class, ok := omni.ParseSessionSubject(subject); ok && traceClass(class) && r.stuck[sid] != nil {
		return seq, nil // its catch-up writes it
	}
	_, err = r.record(subject, m.Data(), seq, md.Timestamp)
	var ae *appendError
	if errors.As(err, &ae) {
		r.store.Forget(ae.sid)
		r.stick(ae.sid, md.Timestamp, ae.err)
		if f := r.o.PositionFailed; f != nil && errors.Is(ae.err, tracefile.ErrPositionWrite) {
			f(1)
		}
		return seq, nil
	}
	return seq, err
}

// appendError is a Session's Trace that could not be written.
type appendError struct {
	sid string
	err error
}

func (e *appendError) Error() string { return "session " + e.sid + ": " + e.err.Error() }
func (e *appendError) Unwrap() error { return e.err }

// record appends one stream message to its Session's Trace when it is a
// Trace record (stored is its stream time); written is false for a
// message skipped or already in the Trace. A failed append is an
// *appendError.
func (r *runner) record(subject string, data []byte, seq uint64, stored time.Time) (written bool, err error) {
	sid, class, ok := omni.ParseSessionSubject(subject)
	if !ok {
		r.log.Warn().Str("subject", subject).Uint64("seq", seq).Msg("skipping message on a non-session subject")
		return false, nil
	}
	if !traceClass(class) {
		return false, nil // partial, nested, server: not Trace records
	}
	if !omni.ValidSessionID(sid) || strings.ContainsAny(sid, `/\`) {
		r.log.Warn().Str("subject", subject).Uint64("seq", seq).Msg("skipping message whose session id cannot name a file")
		return false, nil
	}
	msg, err := omni.Decode(data)
	if err != nil {
		r.log.Warn().Err(err).Str("session_id", sid).Uint64("seq", seq).Str("subject", subject).
			Msg("skipping undecodable message")
		return false, nil
	}
	if msg.IsPartial() {
		r.log.Warn().Str("session_id", sid).Uint64("seq", seq).Str("subject", subject).Msg("skipping partial")
		return false, nil
	}
	if len(msg.Origin) > 0 {
		r.log.Warn().Str("session_id", sid).Uint64("seq", seq).Str("subject", subject).Msg("skipping message with an origin")
		return false, nil
	}
	if bytes.ContainsAny(data, "\r\n") {
		// Valid JSON holds raw line breaks only between tokens: blanking
		// them keeps the record's meaning and the Trace one record a line.
		r.buf = append(r.buf[:0], data...)
		for i, c := range r.buf {
			if c == '\n' || c == '\r' {
				r.buf[i] = ' '
			}
		}
		data = r.buf
		r.log.Warn().Str("session_id", sid).Uint64("seq", seq).Str("subject", subject).
			Msg("record spans several lines; line breaks blanked")
	}
	created := msg.Time()
	if created.IsZero() {
		created = stored
	}
	written, err = r.store.Append(sid, tracefile.Record{Seq: seq, Data: data, Meta: msg.IsSessionMeta(), Time: created})
	if err != nil {
		return false, &appendError{sid: sid, err: fmt.Errorf("seq %d: %w", seq, err)}
	}
	if written {
		r.appended++
	}
	return written, nil
}

func traceClass(class string) bool {
	for _, c := range omni.TraceClasses {
		if c == class {
			return true
		}
	}
	return false
}
