package omni

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// InstructionsFile is the file of a Workspace whose text joins the system
// prompt of the Sessions created on it (as Codex and Claude Code users
// expect).
const InstructionsFile = "AGENTS.md"

// MaxInstructions caps the bytes of InstructionsFile read into a Session.
const MaxInstructions = 64 << 10

// ReadInstructions returns the text of workspace's AGENTS.md: "" when there
// is none; its first MaxInstructions bytes and a note when it is longer (as
// Codex caps project docs); an error when it exists but cannot be read.
func ReadInstructions(workspace string) (string, error) {
	if workspace == "" {
		return "", nil
	}
	path := filepath.Join(workspace, InstructionsFile)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxInstructions+1))
	if err != nil {
		return "", err
	}
	note := ""
	if len(b) > MaxInstructions {
		b = b[:MaxInstructions]
		for len(b) > 0 { // drop a character cut in half
			if r, size := utf8.DecodeLastRune(b); r != utf8.RuneError || size > 1 {
				break
			}
			b = b[:len(b)-1]
		}
		note = fmt.Sprintf("\n\n[%s truncated: only its first %d KiB are included]", InstructionsFile, MaxInstructions>>10)
	}
	return strings.TrimSpace(strings.ToValidUTF8(string(b), "")) + note, nil
}

// WithInstructions returns the system prompt base with a Workspace's
// instructions appended under a heading naming their file.
func WithInstructions(base, instructions string) string {
	if instructions == "" {
		return base
	}
	return base + "\n\n# Project instructions (" + InstructionsFile + ")\n\n" + instructions
}
