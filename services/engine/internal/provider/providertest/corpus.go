package providertest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// golden is the expected outcome of one recorded stream.
type golden struct {
	Deltas []goldenDelta  `json:"deltas"`
	Result *goldenResult  `json:"result"`
	Error  *goldenFailure `json:"error"`
}

type goldenDelta struct {
	Block      int             `json:"block"`
	Type       string          `json:"type"`
	Text       string          `json:"text,omitempty"`
	Name       string          `json:"name,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	End        bool            `json:"end,omitempty"`
	Fidelity   json.RawMessage `json:"fidelity,omitempty"`
}

type goldenResult struct {
	Usage      omni.Usage `json:"usage"`
	StopReason string     `json:"stop_reason"`
}

type goldenFailure struct {
	Status     string `json:"status"`
	Message    string `json:"message"`
	HTTPStatus int    `json:"http_status,omitempty"`
}

func outcome(t *testing.T, ds []model.Delta, res model.Result, err error) golden {
	t.Helper()
	g := golden{Deltas: []goldenDelta{}}
	for _, d := range ds {
		g.Deltas = append(g.Deltas, goldenDelta(d))
	}
	if err != nil {
		me := AsModelError(t, err)
		g.Error = &goldenFailure{Status: me.Status, Message: me.Message, HTTPStatus: me.HTTPStatus}
	} else {
		g.Result = &goldenResult{Usage: res.Usage, StopReason: res.StopReason}
	}
	return g
}

// Corpus replays each recorded provider stream in testdata/*.sse through a
// real HTTP server, runs one request against it with run (given the
// server's URL), checks the Delta contract and compares the deltas and
// result or error with testdata/<name>.golden.json. With update it rewrites
// the goldens instead (review them by hand).
func Corpus(t *testing.T, update bool, run func(t *testing.T, url string) ([]model.Delta, model.Result, error)) {
	t.Helper()
	files, err := filepath.Glob("testdata/*.sse")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".sse")
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			srv := Serve(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Write(raw)
			})
			ds, res, err := run(t, srv.URL)
			if cerr := CheckDeltas(ds, err == nil); cerr != nil {
				t.Error(cerr)
			}
			got, merr := json.MarshalIndent(outcome(t, ds, res, err), "", "  ")
			if merr != nil {
				t.Fatal(merr)
			}
			got = append(got, '\n')
			goldenFile := filepath.Join("testdata", name+".golden.json")
			if update {
				if err := os.WriteFile(goldenFile, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(goldenFile)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("outcome differs from %s:\n got: %s\nwant: %s", goldenFile, got, want)
			}
		})
	}
}
