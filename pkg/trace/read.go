package trace

import (
	"bytes"
	"fmt"
	"io"

	"floe.dev/pkg/omni"
)

// LineError describes a Trace line that was skipped.
type LineError struct {
	Line int  // 1-based line number
	Torn bool // the last line, without its newline: a write cut short by a crash
	Err  error
}

func (e *LineError) Error() string {
	if e.Torn {
		return fmt.Sprintf("trace line %d: torn last line: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("trace line %d: %v", e.Line, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

// Read reads the records of one Trace file. Malformed lines (a torn last
// line, a garbage middle line) are skipped and reported in skipped; err is
// only an I/O error. Lines may be up to 64 MiB long.
func Read(r io.Reader) (msgs []omni.Message, skipped []*LineError, err error) {
	data, rerr := io.ReadAll(r)
	// What was read before an I/O error still counts.
	skipped, err = decodeLines(data, func(_ []byte, m omni.Message) { msgs = append(msgs, m) })
	if err == nil {
		err = rerr
	}
	return msgs, skipped, err
}

// maxLine is the longest Trace line read.
const maxLine = 64 << 20

// decodeLines calls fn with each valid record of data, its line (trimmed,
// a slice of data) and its decoding, and returns the skipped lines.
func decodeLines(data []byte, fn func(line []byte, m omni.Message)) (skipped []*LineError, err error) {
	for line := 1; len(data) > 0; line++ {
		text, rest, complete := bytes.Cut(data, []byte{'\n'})
		if len(text) > maxLine {
			return skipped, fmt.Errorf("trace line %d: longer than 64 MiB", line)
		}
		data = rest
		if text = bytes.TrimSpace(text); len(text) == 0 {
			continue
		}
		m, derr := omni.Decode(text)
		if derr != nil {
			skipped = append(skipped, &LineError{Line: line, Torn: !complete, Err: derr})
			continue
		}
		fn(text, m)
	}
	return skipped, nil
}
