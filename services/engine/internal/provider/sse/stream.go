package sse

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	psse "floe.dev/pkg/sse"
)

// Endpoint is one provider's streaming endpoint: where requests go, the
// header fields every request carries (credentials, API version), the
// HTTP client and the idle timeout.
type Endpoint struct {
	URL    string
	Header http.Header
	Client *http.Client
	Idle   time.Duration
}

// NewEndpoint returns the Endpoint at base + path (def when base is empty;
// a trailing slash of base dropped), with a NewClient when client is nil
// and DefaultIdleTimeout when idle is not positive.
func NewEndpoint(base, def, path string, header http.Header, client *http.Client, idle time.Duration) Endpoint {
	e := Endpoint{URL: strings.TrimRight(base, "/"), Header: header, Client: client, Idle: idle}
	if e.URL == "" {
		e.URL = def
	}
	e.URL += path
	if e.Client == nil {
		e.Client = NewClient()
	}
	if e.Idle <= 0 {
		e.Idle = DefaultIdleTimeout
	}
	return e
}

// Post sends body as a JSON POST asking for an event stream and opens the
// response as Open does. The caller must Close the Body.
func (e Endpoint) Post(ctx context.Context, body []byte) (*Body, error) {
	req, err := http.NewRequest(http.MethodPost, e.URL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	for k, v := range e.Header {
		req.Header[k] = v
	}
	return Open(ctx, e.Client, req, e.Idle)
}

// ErrEnd is what a provider's event handler returns for the stream's
// terminal event.
var ErrEnd = errors.New("sse: stream complete")

// Decode reads body's events and hands each one's data to event until it
// returns ErrEnd (Decode returns nil) or another error (returned as is). A
// stream that ends before its terminal event, named end in the error, is
// malformed. Read errors from body are returned as they are (Body has
// mapped them).
//
// The events are read with pkg/sse; an unterminated last event is handed
// over too, since a truncated stream is judged by the provider's decoder
// (by its terminal event), and an event larger than MaxEventSize is
// malformed.
func Decode(body io.Reader, end string, event func(data []byte) error) error {
	r := psse.NewReader(body)
	for {
		ev, err := r.Next()
		if err == io.EOF {
			if s := r.Stray(); s != "" {
				return Malformed("stream ended before %s; unexpected content: %s", end, Truncate(s))
			}
			return Malformed("stream ended before %s", end)
		}
		if errors.Is(err, psse.ErrTooLarge) {
			return Malformed("stream event larger than %d bytes", MaxEventSize)
		}
		if err != nil {
			return err
		}
		if err := event(ev.Data); err != nil {
			if errors.Is(err, ErrEnd) {
				return nil
			}
			return err
		}
	}
}
