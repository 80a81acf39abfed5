package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestParseEventID(t *testing.T) {
	tests := []struct {
		in    string
		epoch int64
		seq   uint64
		ok    bool
	}{
		{"1700000000000-42", 1700000000000, 42, true},
		{" 5-0 ", 5, 0, true},
		{"42", 0, 0, false},
		{"a-1", 0, 0, false},
		{"1-b", 0, 0, false},
		{"1--2", 0, 0, false},
		{"", 0, 0, false},
	}
	for _, tt := range tests {
		e, s, ok := parseEventID(tt.in)
		if ok != tt.ok || (ok && (e != tt.epoch || s != tt.seq)) {
			t.Errorf("parseEventID(%q) = %d, %d, %v; want %d, %d, %v", tt.in, e, s, ok, tt.epoch, tt.seq, tt.ok)
		}
	}
}

func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                true,
		"application/json; charset=utf-8": true,
		"Application/JSON":                true,
		"application/merge-patch+json":    true,
		"text/plain":                      false,
		"":                                false,
		"application/jsonx":               false,
		"garbage;;":                       false,
	} {
		if got := isJSON(ct); got != want {
			t.Errorf("isJSON(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestAuthenticator(t *testing.T) {
	a := newAuthenticator(map[string]string{"secret-a": "alice", "secret-b": "bob"})
	tests := []struct {
		header string
		who    string
		ok     bool
	}{
		{"Bearer secret-a", "alice", true},
		{"bearer secret-b", "bob", true},
		{"Bearer secret-c", "", false},
		{"Bearer ", "", false},
		{"Basic secret-a", "", false},
		{"secret-a", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		r, _ := http.NewRequest("GET", "/", nil)
		if tt.header != "" {
			r.Header.Set("Authorization", tt.header)
		}
		who, ok := a.check(r)
		if who != tt.who || ok != tt.ok {
			t.Errorf("check(%q) = %q, %v; want %q, %v", tt.header, who, ok, tt.who, tt.ok)
		}
	}
	if newAuthenticator(nil).enabled() {
		t.Error("no tokens: auth enabled")
	}
}

func TestWriteData(t *testing.T) {
	tests := map[string]string{
		`{"a":1}`:       "data: {\"a\":1}\n\n",
		"{\"a\":1}\n":   "data: {\"a\":1}\n\n",
		"line1\nline2":  "data: line1\ndata: line2\n\n",
		"line1\r\nl2\n": "data: line1\ndata: l2\n\n",
	}
	for in, want := range tests {
		if got := string(appendData(nil, []byte(in))); got != want {
			t.Errorf("appendData(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMetricsExpositionEscapesLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.request(`GET /a"b\c`, 200)
	m.request("GET /x", 404)
	m.request("GET /x", 404)
	if again := newMetrics(reg); again.requests != m.requests {
		t.Error("a second gateway on the same registry got its own series")
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		`floe_gateway_http_requests_total{route="GET /a\"b\\c",status="200"} 1`,
		`floe_gateway_http_requests_total{route="GET /x",status="404"} 2`,
		"# TYPE floe_gateway_sse_clients gauge",
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("exposition lacks %q:\n%s", want, rec.Body.String())
		}
	}
}

func TestQueueBoundsAndDrains(t *testing.T) {
	q := newQueue(3)
	for i := range 3 {
		if !q.push(sseItem{seq: uint64(i + 1)}) {
			t.Fatalf("push %d refused below the limit", i)
		}
	}
	if q.push(sseItem{seq: 4}) {
		t.Fatal("push accepted past the limit")
	}
	<-q.notify
	items, closed := q.drain(nil)
	if len(items) != 3 || items[2].seq != 3 || closed {
		t.Fatalf("drain = %v, %v", items, closed)
	}
	if !q.push(sseItem{seq: 5}) {
		t.Fatal("push refused after a drain")
	}
	q.close()
	items, closed = q.drain(items)
	if len(items) != 1 || items[0].seq != 5 || !closed {
		t.Fatalf("drain after close = %v, %v", items, closed)
	}
}

func TestLineRunsWritesEachRecordOnItsLine(t *testing.T) {
	file := []byte("{\"a\":1}\n{\"b\":2}\r\n{\"c\":3}\n{\"d\":4}\n")
	orig := string(file)
	recs := [][]byte{file[0:7], file[8:15], file[17:24], file[25:32], []byte(`{"x":0}`)}
	runs := lineRuns(recs)
	var got []byte
	for _, r := range runs {
		got = append(got, r...)
	}
	want := "{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n{\"d\":4}\n{\"x\":0}\n"
	if string(got) != want {
		t.Fatalf("lineRuns wrote %q, want %q", got, want)
	}
	// c and d lie one after the other, each with its newline: one run,
	// written from the buffer; b's \r keeps it apart.
	if len(runs) != 4 || string(runs[2]) != "{\"c\":3}\n{\"d\":4}\n" || &runs[2][0] != &file[17] {
		t.Fatalf("runs = %q", runs)
	}
	if string(file) != orig {
		t.Fatalf("lineRuns changed the records' buffer: %q", file)
	}
}
