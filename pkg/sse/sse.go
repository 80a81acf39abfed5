// Package sse reads Server-Sent Events (the text/event-stream format):
// the one SSE reader of Floe, used by the engine's model providers, the
// gateway's Go client and the bench. It depends on the standard library
// only and knows no event's payload.
//
// A Reader accepts "\n" and "\r\n" line endings and lines longer than its
// buffer, skips comments (": ping"), strips one space after a field's
// colon, joins an event's data lines with "\n" and bounds an event's size.
// It reports each event's own id, the last retry field and the first line
// that is not SSE at all (Stray), for a stream that turns out to be a JSON
// error or an HTML page.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"
)

// DefaultMaxEventSize bounds one event's data (and one line) unless
// SetMaxEventSize says otherwise: a peer that sends more in a single event
// gets ErrTooLarge rather than growing memory without limit.
const DefaultMaxEventSize = 16 << 20

// ErrTooLarge is returned by Next for an event or line larger than the
// Reader's limit.
var ErrTooLarge = errors.New("sse: event too large")

// Event is one dispatched event. Its slices are valid until the next call
// to Next.
type Event struct {
	// Name is the event field ("" when the event had none).
	Name string
	// ID is the event's own id field, when HasID.
	ID    []byte
	HasID bool
	// Data is the event's data lines joined by "\n".
	Data []byte
	// Unterminated: the stream ended before the blank line that ends this
	// event. The SSE standard discards such an event (a client resuming
	// with Last-Event-ID gets it again); a reader of one response that
	// judges truncation itself (a model provider's decoder) may use it.
	Unterminated bool
}

// Reader reads events from an SSE stream. It is not safe for concurrent
// use.
type Reader struct {
	br    *bufio.Reader
	max   int
	line  []byte // long-line accumulator
	data  []byte
	name  []byte
	id    []byte
	eof   bool
	retry time.Duration

	lastName string
	stray    string // the first line that is not SSE
}

// NewReader returns a Reader over r with a 32 KiB buffer.
func NewReader(r io.Reader) *Reader { return NewReaderSize(r, 32<<10) }

// NewReaderSize returns a Reader over r whose buffer holds size bytes;
// longer lines are accumulated.
func NewReaderSize(r io.Reader, size int) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, size), max: DefaultMaxEventSize}
}

// SetMaxEventSize sets the limit of one event's data and of one line
// (n > 0).
func (r *Reader) SetMaxEventSize(n int) {
	if n > 0 {
		r.max = n
	}
}

var (
	fieldData  = []byte("data")
	fieldEvent = []byte("event")
	fieldID    = []byte("id")
	fieldRetry = []byte("retry")
)

// Next returns the next event with data: a block without a data field is
// not an event. It returns io.EOF at the end of the stream (after an
// Unterminated last event, if any), ErrTooLarge (wrapped) for an event or
// line over the limit, and any other read error unchanged.
func (r *Reader) Next() (Event, error) {
	r.data, r.name, r.id = r.data[:0], r.name[:0], r.id[:0]
	hasData, hasID := false, false
	for {
		if r.eof {
			return Event{}, io.EOF
		}
		line, err := r.readLine()
		if err == io.EOF {
			r.eof = true
			if hasData {
				ev := r.event(hasID)
				ev.Unterminated = true
				return ev, nil
			}
			return Event{}, io.EOF
		}
		if err != nil {
			return Event{}, err
		}
		if len(line) == 0 {
			if hasData {
				return r.event(hasID), nil
			}
			r.name, r.id, hasID = r.name[:0], r.id[:0], false
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch {
		case bytes.Equal(field, fieldData):
			if hasData {
				r.data = append(r.data, '\n')
			}
			if len(r.data)+len(value) > r.max {
				return Event{}, r.tooLarge()
			}
			r.data = append(r.data, value...)
			hasData = true
		case bytes.Equal(field, fieldEvent):
			r.name = append(r.name[:0], value...)
		case bytes.Equal(field, fieldID):
			r.id, hasID = append(r.id[:0], value...), true
		case bytes.Equal(field, fieldRetry):
			if ms, err := strconv.Atoi(string(value)); err == nil && ms > 0 {
				r.retry = time.Duration(ms) * time.Millisecond
			}
		default:
			if r.stray == "" {
				r.stray = truncate(line, 200)
			}
		}
	}
}

// Retry returns the last positive retry field read (0 if none): how long
// the server asks a client to wait before reconnecting.
func (r *Reader) Retry() time.Duration { return r.retry }

// Stray returns the first line that was not an SSE field, comment or blank
// line ("" if none), shortened to about 200 bytes: when a stream turns out
// to be something else (a JSON error with status 200, an HTML page), it
// says what.
func (r *Reader) Stray() string { return r.stray }

func (r *Reader) event(hasID bool) Event {
	ev := Event{Data: r.data, ID: r.id, HasID: hasID}
	if len(r.name) > 0 {
		// Consecutive events mostly share a name (content_block_delta):
		// reuse the last string rather than allocate one per event.
		if string(r.name) != r.lastName {
			r.lastName = string(r.name)
		}
		ev.Name = r.lastName
	}
	return ev
}

// readLine returns the next line without its terminator. The slice is only
// valid until the next read. A final line without terminator is returned
// before io.EOF.
func (r *Reader) readLine() ([]byte, error) {
	line, err := r.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		r.line = append(r.line[:0], line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if len(r.line) > r.max {
				return nil, r.tooLarge()
			}
			line, err = r.br.ReadSlice('\n')
			r.line = append(r.line, line...)
		}
		line = r.line
	}
	if err == io.EOF && len(line) > 0 {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	if n := len(line); n > 0 && line[n-1] == '\n' {
		line = line[:n-1]
	}
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

func (r *Reader) tooLarge() error {
	return fmt.Errorf("%w: larger than %d bytes", ErrTooLarge, r.max)
}

// truncate returns b as a string of at most n bytes, cut at a rune
// boundary.
func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	b = b[:n]
	for len(b) > 0 {
		r, size := utf8.DecodeLastRune(b)
		if r != utf8.RuneError || size > 1 {
			break
		}
		b = b[:len(b)-1]
	}
	return string(b) + "…"
}
