package providertest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"floe.dev/services/engine/internal/model"
)

// Failure is one case of a provider's failure matrix (protocol.md §6):
// what the server does and the error Stream must return.
type Failure struct {
	Name       string
	Handler    http.HandlerFunc // nil: connection refused
	WantStatus string
	WantHTTP   int
	WantInMsg  string
	WantText   string // streamed before the failure
}

// Reject answers every request with code and a JSON body.
func Reject(code int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprint(w, body)
	}
}

// StreamThen answers an event stream of events, each flushed, then calls
// after (when not nil).
func StreamThen(after func(w http.ResponseWriter, r *http.Request), events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			fmt.Fprint(w, e)
			w.(http.Flusher).Flush()
		}
		if after != nil {
			after(w, r)
		}
	}
}

// Failures runs each case, in parallel, against a real HTTP server (a
// closed port, with path after it, where the case has no handler).
// stream sends a request to base with the idle timeout given and returns
// its deltas and error: the error must be the case's, no block ended, its
// message at most 510 bytes.
func Failures(t *testing.T, cases []Failure, path string, stream func(t *testing.T, base string, idle time.Duration) ([]model.Delta, error)) {
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			base := "http://" + ClosedPort(t) + path
			if c.Handler != nil {
				base = Serve(t, c.Handler).URL
			}
			// Only the cases that test the idle timeout get a short one;
			// the others must not trip it on a loaded machine.
			idle := 5 * time.Second
			if strings.Contains(c.WantInMsg, "no data") {
				idle = 200 * time.Millisecond
			}
			start := time.Now()
			ds, err := stream(t, base, idle)
			if err == nil {
				t.Fatalf("Stream succeeded, want %s", c.WantStatus)
			}
			me := AsModelError(t, err)
			if me.Status != c.WantStatus || me.HTTPStatus != c.WantHTTP {
				t.Errorf("error = %+v, want status %s HTTP %d", me, c.WantStatus, c.WantHTTP)
			}
			if model.StatusOf(err) != c.WantStatus {
				t.Errorf("StatusOf = %s", model.StatusOf(err))
			}
			if !strings.Contains(me.Message, c.WantInMsg) {
				t.Errorf("message %q does not contain %q", me.Message, c.WantInMsg)
			}
			if len(me.Message) > 510 {
				t.Errorf("message is %d bytes long", len(me.Message))
			}
			if got := BlockText(ds, 0); got != c.WantText {
				t.Errorf("streamed %q before failing, want %q", got, c.WantText)
			}
			for _, d := range ds {
				if d.End {
					t.Errorf("End delta %+v emitted on a failed stream", d)
				}
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("failure took %s", el)
			}
		})
	}
}
