package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"floe.dev/pkg/sse"
)

// sseConn is a minimal SSE client on a raw loopback TCP connection: an
// HTTP/1.1 GET of the gateway's stream route, chunked body decoded by
// net/http, events parsed in place by pkg/sse (no allocation per event). It is
// lighter than the gateway's Go client (no channel, no reconnect), so the
// figures are the gateway's, not a client library's.
type sseConn struct {
	addr, sid string
	bufSize   int
	lastID    []byte // the last event id seen, for Last-Event-ID
	c         net.Conn
	body      io.ReadCloser
	r         *sse.Reader
}

// sseEvent is one event; its slices are valid until the next read.
type sseEvent struct {
	seq    uint64 // from the id <epoch>-<seq>; 0 without id
	server bool   // event: server_event
	data   []byte
}

// dialSSE opens the stream of Session sid and returns once the response
// headers arrived.
func dialSSE(ctx context.Context, addr, sid string, bufSize int) (*sseConn, error) {
	s := &sseConn{addr: addr, sid: sid, bufSize: bufSize}
	if err := s.dial(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// reconnect opens the stream again with Last-Event-ID, as an SSE client
// does after the gateway disconnected it: the gap is replayed.
func (s *sseConn) reconnect(ctx context.Context) error {
	s.c.Close()
	return s.dial(ctx)
}

func (s *sseConn) dial(ctx context.Context) error {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("bench: dial gateway: %w", err)
	}
	last := ""
	if len(s.lastID) > 0 {
		last = "Last-Event-ID: " + string(s.lastID) + "\r\n"
	}
	if _, err := fmt.Fprintf(c, "GET /api/sessions/%s/stream HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n%s\r\n", s.sid, s.addr, last); err != nil {
		c.Close()
		return fmt.Errorf("bench: stream request: %w", err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 4096), nil)
	if err != nil {
		c.Close()
		return fmt.Errorf("bench: stream response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return fmt.Errorf("bench: stream of %s: HTTP %d", s.sid, resp.StatusCode)
	}
	c.SetReadDeadline(time.Time{})
	s.c, s.body, s.r = c, resp.Body, sse.NewReaderSize(resp.Body, s.bufSize)
	return nil
}

func (s *sseConn) close() { s.c.Close() }

// next reads the next event (comments and heartbeats skipped). A stream
// that ends mid-event ends with io.EOF, the event discarded.
func (s *sseConn) next() (sseEvent, error) {
	e, err := s.r.Next()
	if err != nil {
		return sseEvent{}, err
	}
	if e.Unterminated {
		return sseEvent{}, io.EOF
	}
	ev := sseEvent{data: e.Data, server: e.Name == "server_event"}
	if e.HasID {
		s.lastID = append(s.lastID[:0], e.ID...)
		if _, q, ok := bytes.Cut(e.ID, []byte{'-'}); ok {
			ev.seq, _ = strconv.ParseUint(string(q), 10, 64)
		}
	}
	return ev, nil
}

// nextResuming reads the next event as next does; when the stream is cut
// (the gateway disconnects a slow client) it resumes it (reconnect), as
// clients do, while ctx lasts and *resumes, the count of resumes, is below
// maxReconnects.
func (s *sseConn) nextResuming(ctx context.Context, resumes *int) (sseEvent, error) {
	for {
		ev, err := s.next()
		if err == nil || *resumes >= maxReconnects || ctx.Err() != nil {
			return ev, err
		}
		*resumes++
		if err := s.reconnect(ctx); err != nil {
			return sseEvent{}, err
		}
	}
}
