package trace

import (
	"bufio"
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
	skipped, err = readLines(r, func(_ []byte, m omni.Message) { msgs = append(msgs, m) })
	return msgs, skipped, err
}

// readLines calls fn with each valid record of r, its line (trimmed, valid
// only during the call) and its decoding, and returns the skipped lines.
func readLines(r io.Reader, fn func(line []byte, m omni.Message)) (skipped []*LineError, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	line := 0
	var buf []byte
	for {
		chunk, rerr := br.ReadSlice('\n')
		buf = append(buf, chunk...)
		if rerr == bufio.ErrBufferFull {
			if len(buf) > 64<<20 {
				return skipped, fmt.Errorf("trace line %d: longer than 64 MiB", line+1)
			}
			continue
		}
		if len(buf) > 0 {
			line++
			complete := buf[len(buf)-1] == '\n'
			text := bytes.TrimSpace(buf)
			if len(text) > 0 {
				m, derr := omni.Decode(text)
				if derr != nil {
					skipped = append(skipped, &LineError{Line: line, Torn: !complete && rerr == io.EOF, Err: derr})
				} else {
					fn(text, m)
				}
			}
			buf = buf[:0]
		}
		if rerr == io.EOF {
			return skipped, nil
		}
		if rerr != nil {
			return skipped, rerr
		}
	}
}
