// Package sse is the transport shared by the HTTP model providers: it sends
// one streaming request with a per-request idle timeout, reads the response
// as Server-Sent Events, and maps transport and HTTP failures to the
// model.Error statuses of protocol.md §6. It knows no provider's stream format:
// the openai and anthropic packages decode the events; only the common
// shapes of error bodies are read here, for the error message.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// MaxEventSize bounds one event's data (and one line). A provider that sends
// more in a single event is treated as a malformed stream rather than being
// allowed to grow memory without limit.
const MaxEventSize = 16 << 20

// Event is one dispatched Server-Sent Event.
type Event struct {
	// Name is the event field ("" when the event had none).
	Name string
	// Data is the event's data lines joined by "\n". It is only valid until
	// the next call to Next.
	Data []byte
}

// Reader reads events from an SSE stream. It accepts "\n" and "\r\n" line
// endings, skips comments (": OPENROUTER PROCESSING") and the id and retry
// fields, and dispatches an unterminated last event at end of input, since a
// truncated stream is judged by the provider decoder, not here. It is not
// safe for concurrent use.
type Reader struct {
	br   *bufio.Reader
	max  int
	line []byte // long-line accumulator
	data []byte
	name []byte
	eof  bool

	lastName string
	stray    string // the first line that is not SSE
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 32<<10), max: MaxEventSize}
}

var (
	fieldData  = []byte("data")
	fieldEvent = []byte("event")
	fieldID    = []byte("id")
	fieldRetry = []byte("retry")
)

// Next returns the next event with data. It returns io.EOF at the end of the
// stream, a *model.Error with status malformed for an event larger than
// MaxEventSize, and any other read error unchanged.
func (r *Reader) Next() (Event, error) {
	r.data = r.data[:0]
	r.name = r.name[:0]
	hasData := false
	for {
		if r.eof {
			return Event{}, io.EOF
		}
		line, err := r.readLine()
		if err == io.EOF {
			r.eof = true
			if hasData {
				return r.event(), nil
			}
			return Event{}, io.EOF
		}
		if err != nil {
			return Event{}, err
		}
		if len(line) == 0 {
			if hasData {
				return r.event(), nil
			}
			r.name = r.name[:0]
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
				return Event{}, tooLarge()
			}
			r.data = append(r.data, value...)
			hasData = true
		case bytes.Equal(field, fieldEvent):
			r.name = append(r.name[:0], value...)
		case bytes.Equal(field, fieldID), bytes.Equal(field, fieldRetry):
		default:
			if r.stray == "" {
				r.stray = Truncate(string(line[:min(len(line), 200)]))
			}
		}
	}
}

// Stray returns the first line that was not an SSE field, comment or blank
// line ("" if none), shortened: when a stream turns out to be something else
// (a JSON error with status 200, an HTML page), it says what.
func (r *Reader) Stray() string { return r.stray }

func (r *Reader) event() Event {
	ev := Event{Data: r.data}
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
				return nil, tooLarge()
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

func tooLarge() error {
	return &model.Error{Status: omni.StatusMalformed, Message: fmt.Sprintf("stream event larger than %d bytes", MaxEventSize)}
}
