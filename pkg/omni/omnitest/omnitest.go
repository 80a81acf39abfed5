// Package omnitest holds protocol fixtures that the tests of several
// modules share. It imports no NATS; only tests import it.
package omnitest

import (
	"bytes"
	"os"
	"testing"
)

// Lines returns the lines of the JSONL file at path (omni's
// testdata/golden.jsonl, say), which must end with a newline.
func Lines(t testing.TB, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	if !bytes.HasSuffix(data, []byte("\n")) {
		t.Fatalf("%s does not end with a newline", path)
	}
	return bytes.Split(data[:len(data)-1], []byte("\n"))
}
