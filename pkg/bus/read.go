package bus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus/retry"
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
//
// It reads with a Tail, so a consumer lost under it (its server gone, or
// deleted) is replaced from the sequence after the last message delivered:
// no gap, no repeat. fn runs on the caller's goroutine.
func Follow(ctx context.Context, js jetstream.JetStream, sessionID string, classes []string, startSeq uint64, untilCaughtUp bool, fn func(StreamMsg) error) error {
	return follow(ctx, js, sessionID, classes, startSeq, untilCaughtUp, followOptions{}, fn)
}

// Scan is Follow until caught up for a server that reads history for its
// clients: created, when set, runs once the consumer exists and before any
// delivery (its error ends the scan), and the consumer of a scan whose
// process vanished is dropped by the server after a minute. A consumer lost
// before the scan caught up is replaced (Tail), so a scan never returns a
// short history.
func Scan(ctx context.Context, js jetstream.JetStream, sessionID string, classes []string, startSeq uint64, created func() error, fn func(StreamMsg) error) error {
	return follow(ctx, js, sessionID, classes, startSeq, true, followOptions{created: created, inactive: time.Minute}, fn)
}

type followOptions struct {
	created  func() error
	inactive time.Duration
}

// followBuffer is how many messages a Follow's Tail may hand over ahead of
// fn; a full buffer holds up the Tail's delivery (and so the pulls).
const followBuffer = 64

func follow(ctx context.Context, js jetstream.JetStream, sessionID string, classes []string, startSeq uint64, untilCaughtUp bool, o followOptions, fn func(StreamMsg) error) error {
	msgs := make(chan jetstream.Msg, followBuffer)
	quit := make(chan struct{})
	hand := func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-quit: // Follow is returning: never block the Tail's Stop
		}
	}
	// The first consumer is created under ctx, retried like nats.go's
	// ordered consumer retried its creation (a server too busy to answer
	// in time, a stream leader being elected).
	tail, err := retry.Do(ctx, retry.Exponential(100*time.Millisecond, 2*time.Second), 0, func() (*Tail, error) {
		t, err := StartTail(ctx, js, omni.SessionsStream, Filters(sessionID, classes), startSeq,
			TailOptions{CreateTimeout: 5 * time.Second, inactive: o.inactive}, hand)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			err = retry.Permanent(err)
		}
		return t, err
	}, nil)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("bus: follow %s: %w", sessionID, err)
	}
	// Stopped (its consumer deleted in the background, so a caller reading
	// history does not wait for the round trip) however Follow returns.
	defer func() {
		close(quit)
		tail.stop(false)
	}()
	if o.created != nil {
		if err := o.created(); err != nil {
			return err
		}
	}
	if untilCaughtUp && tail.pendingAtStart == 0 {
		return nil
	}
	// Caught up is normally the message that leaves none pending; when
	// the messages still to come are purged instead (an idle Session's
	// purge, a retention), none does, and a quiet read asks the consumer.
	var check <-chan time.Time
	if untilCaughtUp {
		tick := time.NewTicker(caughtUpCheck)
		defer tick.Stop()
		check = tick.C
	}
	quiet := false // no message since the last tick
	for {
		var m jetstream.Msg
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m = <-msgs:
			quiet = false
		case <-check:
			if !quiet || len(msgs) > 0 {
				quiet = true
				continue
			}
			if drained, err := tail.drained(ctx); err == nil && drained && len(msgs) == 0 {
				return nil
			}
			continue
		}
		md, err := m.Metadata() // the Tail checked it
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

// Holds reports whether FLOE_SESSIONS holds a message of the Session's
// classes (all when empty) at or after sequence from. It asks the stream
// leader (STREAM.MSG.GET, next by subject), one request per class at once:
// a direct get may be answered by a follower that has not stored the
// latest messages yet. It is much cheaper than a consumer when the answer
// is no (a reader that is caught up); when it is yes, the message found is
// transferred.
func Holds(ctx context.Context, js jetstream.JetStream, sessionID string, classes []string, from uint64) (bool, error) {
	filters := Filters(sessionID, classes)
	type answer struct {
		found bool
		err   error
	}
	answers := make(chan answer, len(filters))
	for _, f := range filters {
		go func() {
			seq, found, err := msgGet(ctx, js, struct {
				Seq     uint64 `json:"seq"`
				NextFor string `json:"next_by_subj"`
			}{from, f})
			answers <- answer{found && seq >= from, err}
		}()
	}
	var (
		found bool
		err   error
	)
	for range filters {
		a := <-answers
		found = found || a.found
		err = cmp.Or(err, a.err)
	}
	if err != nil {
		return false, fmt.Errorf("bus: messages of %s from seq %d: %w", sessionID, from, err)
	}
	return found, nil
}

// msgGet sends one STREAM.MSG.GET request for FLOE_SESSIONS to the
// stream's leader (not a direct get, which a lagging follower may answer)
// and returns the sequence of the message found, or found false when there
// is none. Without a deadline on ctx it waits at most 5 s: with no leader
// nobody answers, and the request would wait for ever.
func msgGet(ctx context.Context, js jetstream.JetStream, req any) (seq uint64, found bool, err error) {
	seq, _, found, err = msgGetAt(ctx, js, req)
	return seq, found, err
}

// msgGetAt is msgGet that also returns the message's stored time.
func msgGetAt(ctx context.Context, js jetstream.JetStream, req any) (seq uint64, at time.Time, found bool, err error) {
	seq, at, _, found, err = msgGetData(ctx, js, req)
	return seq, at, found, err
}

// LastMessage returns the sequence and data of the last message
// FLOE_SESSIONS holds on subject as the stream's leader knows it (0 and
// nil: none).
func LastMessage(ctx context.Context, js jetstream.JetStream, subject string) (uint64, []byte, error) {
	seq, _, data, _, err := msgGetData(ctx, js, map[string]string{"last_by_subj": subject})
	if err != nil {
		return 0, nil, fmt.Errorf("bus: last message on %s: %w", subject, err)
	}
	return seq, data, nil
}

// msgGetData is msgGetAt that also returns the message's data.
func msgGetData(ctx context.Context, js jetstream.JetStream, req any) (seq uint64, at time.Time, data []byte, found bool, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, at, nil, false, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	msg, err := js.Conn().RequestWithContext(ctx, apiPrefix(js)+"STREAM.MSG.GET."+omni.SessionsStream, body)
	if err != nil {
		return 0, at, nil, false, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Seq  uint64    `json:"seq"`
			Time time.Time `json:"time"`
			Data []byte    `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, at, nil, false, fmt.Errorf("message get response: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, at, nil, false, nil
	case resp.Error != nil:
		return 0, at, nil, false, fmt.Errorf("message get: %w", resp.Error)
	case resp.Message == nil:
		return 0, at, nil, false, errors.New("message get: empty response")
	}
	return resp.Message.Seq, resp.Message.Time, resp.Message.Data, true, nil
}

// apiPrefix is the JetStream API prefix js sends its requests to.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// caughtUpCheck is how long a read until caught up waits without a
// message before it asks its consumer whether anything is left.
const caughtUpCheck = 500 * time.Millisecond

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

// LastStoredAt is LastStored with the time the message was stored (zero
// when there is none).
func LastStoredAt(ctx context.Context, js jetstream.JetStream, subject string) (uint64, time.Time, error) {
	seq, at, _, err := msgGetAt(ctx, js, map[string]string{"last_by_subj": subject})
	if err != nil {
		return 0, at, fmt.Errorf("bus: last message on %s: %w", subject, err)
	}
	return seq, at, nil
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

// LastStored returns the stream sequence of the last message FLOE_SESSIONS
// holds on subject (0: none), as the stream's leader knows it. A direct
// get or a new consumer may be served by a replica that has not applied
// the latest messages yet; a read-back that must see everything stored
// (the engine closing a failed attempt) reads until it has reached this.
// Without a deadline on ctx it waits at most 5 s.
func LastStored(ctx context.Context, js jetstream.JetStream, subject string) (uint64, error) {
	seq, _, err := msgGet(ctx, js, map[string]string{"last_by_subj": subject})
	if err != nil {
		return 0, fmt.Errorf("bus: last message on %s: %w", subject, err)
	}
	return seq, nil
}
