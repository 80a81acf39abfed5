package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/sse"
)

// Event is one SSE event of a Session stream.
type Event struct {
	// ID is <epoch>-<seq> for events of the stream; empty for the task_state
	// snapshot, re-sent approval requests and resync_required.
	ID string
	// Event is "" for an OmniMessage and "server_event" for a server event.
	Event string
	// Data is the event's JSON, as the gateway sent it.
	Data []byte
}

// EventServer is the SSE event name of server events.
const EventServer = "server_event"

// Stream is an open SSE stream that reconnects by itself.
type Stream struct {
	// C delivers the events in order. It is closed when the stream ends:
	// its context ended, or the gateway refused to reconnect (Err says why).
	C <-chan Event

	mu         sync.Mutex
	lastID     string
	err        error
	connects   int
	done       chan struct{}
	minBackoff time.Duration
	maxBackoff time.Duration
}

// StreamOption configures Stream.
type StreamOption func(*Stream)

// WithReconnectDelay sets the reconnect backoff: first delay min, doubling
// up to max (defaults 200ms and 5s).
func WithReconnectDelay(min, max time.Duration) StreamOption {
	return func(s *Stream) { s.minBackoff, s.maxBackoff = min, max }
}

// Err returns why the stream ended (nil while it runs, or when its context
// ended).
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// LastEventID returns the id of the last event received that had one. It
// moves when an event is put into C, which is buffered, so the caller may
// not have read it yet: to resume elsewhere after the stream ended, first
// read C until it is closed (the events it still holds are up to this id).
func (s *Stream) LastEventID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastID
}

// Connects returns how many connections the stream has made (1 + reconnects).
func (s *Stream) Connects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connects
}

// Done is closed when the stream's goroutine has exited.
func (s *Stream) Done() <-chan struct{} { return s.done }

// Stream opens a Session's SSE stream (GET /api/sessions/{id}/stream),
// resuming after lastEventID when it is set. The first connection is made
// before Stream returns (an *APIError when refused). When a connection
// drops, the stream reconnects with the last id it received, so the gateway
// replays the gap (or sends resync_required); 401 and 404 end it. C is
// closed when ctx ends or the stream ends.
func (c *Client) Stream(ctx context.Context, id, lastEventID string, opts ...StreamOption) (*Stream, error) {
	ch := make(chan Event, 64)
	s := &Stream{C: ch, lastID: lastEventID, done: make(chan struct{}), minBackoff: 200 * time.Millisecond, maxBackoff: 5 * time.Second}
	for _, o := range opts {
		o(s)
	}
	body, err := c.connect(ctx, id, lastEventID)
	if err != nil {
		return nil, err
	}
	s.connects = 1
	go s.run(ctx, c, id, body, ch)
	return s, nil
}

func (c *Client) connect(ctx context.Context, id, lastID string) (io.ReadCloser, error) {
	req, err := c.newRequest(ctx, http.MethodGet, sessionPath(id, "stream"), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("gateway: stream: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, readAPIError(resp)
	}
	return resp.Body, nil
}

func permanent(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		switch ae.Status {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusBadRequest:
			return true
		}
	}
	return false
}

func (s *Stream) run(ctx context.Context, c *Client, id string, body io.ReadCloser, ch chan<- Event) {
	defer close(s.done)
	defer close(ch)
	backoff := retry.Exponential(s.minBackoff, s.maxBackoff)
	for {
		stop := context.AfterFunc(ctx, func() { body.Close() })
		got := s.read(ctx, body, ch)
		stop()
		body.Close()
		if got {
			// The gateway's retry field may have moved the first delay.
			backoff = retry.Exponential(s.minBackoff, s.maxBackoff)
		}
		for {
			if retry.Sleep(ctx, backoff.NextBackOff()) != nil {
				return
			}
			var err error
			body, err = c.connect(ctx, id, s.LastEventID())
			if err == nil {
				s.mu.Lock()
				s.connects++
				s.mu.Unlock()
				break
			}
			if ctx.Err() != nil {
				return
			}
			if permanent(err) {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				return
			}
		}
	}
}

// read parses one connection's events until it ends; it reports whether
// any event arrived.
func (s *Stream) read(ctx context.Context, body io.Reader, ch chan<- Event) bool {
	r := sse.NewReaderSize(body, 64<<10)
	got := false
	for {
		ev, err := r.Next()
		// The gateway's retry field moves the first reconnect delay.
		if d := r.Retry(); d > 0 {
			s.minBackoff = d
		}
		if err != nil || ev.Unterminated {
			return got // a partial event at EOF is discarded, as SSE says
		}
		out := Event{Event: ev.Name, Data: bytes.Clone(ev.Data)}
		if ev.HasID {
			out.ID = string(ev.ID)
		}
		select {
		case ch <- out:
			got = true
		case <-ctx.Done():
			return got
		}
		// The id moves only once its event is handed over, so a
		// reconnect resumes after the last event the caller has.
		if ev.HasID {
			s.mu.Lock()
			s.lastID = out.ID
			s.mu.Unlock()
		}
	}
}
