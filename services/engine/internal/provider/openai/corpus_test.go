package openai

import (
	"flag"
	"testing"

	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/providertest"
)

var update = flag.Bool("update", false, "rewrite the testdata/*.golden.json files from the current decoder")

// TestCorpus replays each recorded stream in testdata/*.sse and compares
// the outcome with its golden file (-update regenerates them).
func TestCorpus(t *testing.T) {
	providertest.Corpus(t, *update, func(t *testing.T, url string) ([]model.Delta, model.Result, error) {
		return stream(t, New(Config{BaseURL: url}), simpleRequest())
	})
}
