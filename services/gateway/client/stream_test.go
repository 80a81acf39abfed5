package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestStreamParsesAndResumes serves SSE in odd write splits, drops the
// connection, and checks that the client resumes with the last id it
// delivered.
func TestStreamParsesAndResumes(t *testing.T) {
	var mu sync.Mutex
	var lastIDs []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		lastIDs = append(lastIDs, r.Header.Get("Last-Event-ID"))
		n := len(lastIDs)
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(401)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		switch n {
		case 1:
			for _, chunk := range []string{
				"event: server_event\ndata: {\"type\":\"task_state\",\"state\":\"idle\"}\n\n",
				": heartbeat\n\n",
				"id: 1-5\nda", "ta: {\"a\":1}\n", "\n",
				"id: 1-6\r\ndata: {\"b\":\r\ndata: 2}\r\n\r\n",
				"id: 1-7\ndata: {\"torn", // cut before its end: discarded
			} {
				w.Write([]byte(chunk))
				f.Flush()
			}
		case 2:
			w.Write([]byte("id: 1-7\ndata: {\"c\":3}\n\n"))
			f.Flush()
			<-r.Context().Done()
		}
	}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := New(srv.URL, WithToken("tok"))
	s, err := c.Stream(ctx, "s1", "", WithReconnectDelay(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{ID: "", Event: EventServer, Data: []byte(`{"type":"task_state","state":"idle"}`)},
		{ID: "1-5", Data: []byte(`{"a":1}`)},
		{ID: "1-6", Data: []byte("{\"b\":\n2}")},
		{ID: "1-7", Data: []byte(`{"c":3}`)},
	}
	for i, w := range want {
		select {
		case got := <-s.C:
			if got.ID != w.ID || got.Event != w.Event || string(got.Data) != string(w.Data) {
				t.Fatalf("event %d = %+v %q, want %+v %q", i, got, got.Data, w, w.Data)
			}
		case <-ctx.Done():
			t.Fatalf("event %d missing", i)
		}
	}
	mu.Lock()
	ids := append([]string(nil), lastIDs...)
	mu.Unlock()
	if len(ids) != 2 || ids[0] != "" || ids[1] != "1-6" {
		t.Fatalf("Last-Event-ID per connection = %q, want [\"\" \"1-6\"]", ids)
	}
	for deadline := time.Now().Add(5 * time.Second); s.LastEventID() != "1-7" && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // the id moves right after the hand-over
	}
	if s.LastEventID() != "1-7" || s.Connects() != 2 {
		t.Fatalf("last id %q, connects %d", s.LastEventID(), s.Connects())
	}
	cancel()
	<-s.Done()

	// A refused first connection is an *APIError.
	_, err = New(srv.URL).Stream(context.Background(), "s1", "")
	var ae *APIError
	if !asAPIError(err, &ae) || ae.Status != 401 {
		t.Fatalf("unauthenticated stream: %v", err)
	}
}

func asAPIError(err error, target **APIError) bool {
	e, ok := err.(*APIError)
	if ok {
		*target = e
	}
	return ok
}
