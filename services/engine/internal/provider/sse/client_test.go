package sse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

func TestStatusForHTTP(t *testing.T) {
	cases := []struct {
		code int
		body string
		want string
	}{
		{401, "", omni.StatusAuth},
		{403, `{"error":{"message":"Invalid API key","code":"invalid_api_key"}}`, omni.StatusAuth},
		{403, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`, omni.StatusAuth},
		{403, `{"error":{"message":"API key expired. Please renew the API key."}}`, omni.StatusAuth},
		{403, `{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}`, omni.StatusFailed},
		{403, `Forbidden`, omni.StatusFailed},
		{408, "", omni.StatusTimeout},
		{429, "", omni.StatusTimeout},
		{500, "", omni.StatusTimeout},
		{503, "", omni.StatusTimeout},
		{529, "", omni.StatusTimeout},
		{400, "", omni.StatusFailed},
		{404, "", omni.StatusFailed},
		{413, "", omni.StatusFailed},
		{422, "", omni.StatusFailed},
	}
	for _, c := range cases {
		if got := StatusForHTTP(c.code, []byte(c.body)); got != c.want {
			t.Errorf("StatusForHTTP(%d, %.40q) = %s, want %s", c.code, c.body, got, c.want)
		}
	}
}

func TestErrorText(t *testing.T) {
	cases := []struct{ body, want string }{
		{`{"error":{"message":"bad","type":"invalid_request_error","code":null}}`, "invalid_request_error: bad"},
		{`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, "overloaded_error: Overloaded"},
		{`{"error":{"message":"slow","code":"rate_limit_exceeded"}}`, "rate_limit_exceeded: slow"},
		{`{"error":{"message":"upstream","code":502}}`, "upstream"},
		{`{"error":"model not found"}`, "model not found"},
		{`{"object":"error","message":"vllm says no","code":400}`, "vllm says no"},
		{"  <html>Bad Gateway</html>\n", "<html>Bad Gateway</html>"},
		{"", ""},
	}
	for _, c := range cases {
		if got := ErrorText([]byte(c.body)); got != c.want {
			t.Errorf("ErrorText(%q) = %q, want %q", c.body, got, c.want)
		}
	}
}

func TestTruncateKeepsRunes(t *testing.T) {
	s := strings.Repeat("é", 400) // 800 bytes
	got := Truncate(s)
	if len(got) > MaxMessage+len("…") || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Fatalf("Truncate = %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if Truncate("short") != "short" {
		t.Fatal("short string changed")
	}
}

func TestOpenIdleTimeoutCoversHeadersAndBody(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/body" {
			fmt.Fprint(w, "data: a\n\n")
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	for _, path := range []string{"/headers", "/body"} {
		t.Run(path, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader("{}"))
			start := time.Now()
			body, err := Open(context.Background(), NewClient(), req, 100*time.Millisecond)
			if err == nil {
				defer body.Close()
				_, err = io.ReadAll(body)
			}
			var me *model.Error
			if !errors.As(err, &me) || me.Status != omni.StatusTimeout {
				t.Fatalf("err = %v, want timeout", err)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("idle timeout took %s", el)
			}
		})
	}
}

func TestOpenIdleTimerRearmsOnData(t *testing.T) {
	// A stream that sends a byte more often than the idle timeout, for
	// longer than the idle timeout, must not time out. The server paces
	// itself on the client's acknowledgements, not on sleeps.
	ack := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		for i := 0; i < 4; i++ {
			fmt.Fprint(w, ": keepalive\n")
			w.(http.Flusher).Flush()
			select {
			case <-ack:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprint(w, "data: done\n\n")
	}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	idle := 600 * time.Millisecond
	body, err := Open(context.Background(), NewClient(), req, idle)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	buf := make([]byte, 64)
	start := time.Now()
	for i := 0; i < 4; i++ {
		if _, err := body.Read(buf); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		// wait a third of the idle timeout before asking for more: over
		// four rounds this outlasts one idle period.
		timer := time.NewTimer(idle / 3)
		<-timer.C
		ack <- struct{}{}
	}
	if rest, err := io.ReadAll(body); err != nil || !strings.Contains(string(rest), "data: done") {
		t.Fatalf("tail = %q, %v", rest, err)
	}
	if time.Since(start) < idle {
		t.Fatalf("test ran shorter than the idle timeout; it proves nothing")
	}
}

func TestOpenCancelledContext(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "data: a\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	body, err := Open(ctx, NewClient(), req, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	buf := make([]byte, 64)
	if _, err := body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	_, err = io.ReadAll(body)
	if !errors.Is(err, context.Canceled) || model.StatusOf(err) != omni.StatusAborted {
		t.Fatalf("read after cancel = %v, want context.Canceled", err)
	}
}

func TestClassifyPermanentTransportErrors(t *testing.T) {
	req, _ := http.NewRequest(http.MethodPost, "ftp://127.0.0.1/x", nil)
	_, err := Open(context.Background(), NewClient(), req, time.Second)
	var me *model.Error
	if !errors.As(err, &me) || me.Status != omni.StatusFailed {
		t.Fatalf("unsupported scheme: %v, want failed", err)
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	req, _ = http.NewRequest(http.MethodPost, srv.URL, nil)
	_, err = Open(context.Background(), NewClient(), req, 5*time.Second)
	if !errors.As(err, &me) || me.Status != omni.StatusFailed {
		t.Fatalf("untrusted certificate: %v, want failed", err)
	}
}

// A connection refused by a loopback model server is retried once and
// names the URL; one refused elsewhere keeps the engine's ladder.
func TestClassifyRefusedLocalServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions?x=1", nil)
	_, err = http.DefaultClient.Do(req)
	if err == nil {
		t.Fatal("a closed port answered")
	}
	me := Classify(err)
	if me.Status != omni.StatusTimeout || me.MaxRetries != 1 || !strings.Contains(me.Message, "http://"+addr+"/v1/chat/completions (is it running?)") || strings.Contains(me.Message, "x=1") {
		t.Fatalf("Classify(refused local) = %+v", me)
	}
	remote := &url.Error{Op: "Post", URL: "http://203.0.113.7:443/v1", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	if me := Classify(remote); me.MaxRetries != 0 || me.Status != omni.StatusTimeout {
		t.Fatalf("Classify(refused remote) = %+v, want the ladder's retries", me)
	}
}
