package tools

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// execute runs call through r with an emit that records the fragments, and
// checks the emit contract: fragments are non-empty, valid UTF-8 and
// concatenate to Result.Output.
func execute(t *testing.T, ctx context.Context, r *Registry, call Call) Result {
	t.Helper()
	return executeWith(t, ctx, r, call, nil)
}

// executeWith is execute with also onFragment called for every fragment.
func executeWith(t *testing.T, ctx context.Context, r *Registry, call Call, onFragment func(string)) Result {
	t.Helper()
	var frags []string
	res := r.Execute(ctx, call, func(s string) {
		frags = append(frags, s)
		if onFragment != nil {
			onFragment(s)
		}
	})
	checkFragments(t, frags, res)
	return res
}

func checkFragments(t *testing.T, frags []string, res Result) {
	t.Helper()
	for i, f := range frags {
		if f == "" {
			t.Errorf("fragment %d is empty", i)
		}
		if !utf8.ValidString(f) {
			t.Errorf("fragment %d = %q, not valid UTF-8", i, f)
		}
	}
	if got := strings.Join(frags, ""); got != res.Output {
		t.Errorf("concatenated fragments = %q, want Result.Output %q", clip(got), clip(res.Output))
	}
}

// clip shortens s for failure messages.
func clip(s string) string {
	if len(s) > 300 {
		return s[:150] + "…" + s[len(s)-150:]
	}
	return s
}

// args returns the JSON text of v.
func args(t *testing.T, v map[string]any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// realDir returns dir with symbolic links resolved.
func realDir(t *testing.T, dir string) string {
	t.Helper()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	return real
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// checkFor retries f until it returns nil or timeout passes.
func checkFor(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
