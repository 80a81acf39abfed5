package trace

import (
	"bufio"
	"bytes"
	"errors"
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
// only an I/O error (what was read before it still counts) or a line
// longer than 64 MiB. Lines may be up to 64 MiB long.
func Read(r io.Reader) (msgs []omni.Message, skipped []*LineError, err error) {
	skipped, err = eachLine(readerLines(r, 64<<10), func(_ []byte, m *omni.Message) { msgs = append(msgs, *m) })
	return msgs, skipped, err
}

// maxLine is the longest Trace line read.
const maxLine = 64 << 20

// errLongLine reports a line over maxLine.
var errLongLine = errors.New("longer than 64 MiB")

// eachLine calls fn with each valid record of the lines next returns (each
// with its newline unless it is the last, then io.EOF; an error may come
// with the last line): the line, trimmed, and its decoding. The decoding
// is one Message reused for every line, but each decoding has its own
// strings and slices, so a shallow copy of it may be kept. It returns the
// skipped lines.
func eachLine(next func() ([]byte, error), fn func(line []byte, m *omni.Message)) (skipped []*LineError, err error) {
	var m omni.Message
	for line := 1; ; line++ {
		text, rerr := next()
		if len(text) > maxLine || errors.Is(rerr, errLongLine) {
			return skipped, fmt.Errorf("trace line %d: %w", line, errLongLine)
		}
		complete := len(text) > 0 && text[len(text)-1] == '\n'
		if text = bytes.TrimSpace(text); len(text) > 0 {
			if derr := decode(text, &m); derr != nil {
				skipped = append(skipped, &LineError{Line: line, Torn: !complete, Err: derr})
			} else {
				fn(text, &m)
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				rerr = nil
			}
			return skipped, rerr
		}
	}
}

// dataLines returns the lines of data for eachLine, as slices of data.
func dataLines(data []byte) func() ([]byte, error) {
	return func() ([]byte, error) {
		if len(data) == 0 {
			return nil, io.EOF
		}
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line = data[:i+1]
		}
		data = data[len(line):]
		return line, nil
	}
}

// readerLines returns the lines of r for eachLine, read through a buffer
// of size bytes. A line is only valid until the next one is read: the
// buffer is reused, and so is the one that gathers a longer line.
func readerLines(r io.Reader, size int) func() ([]byte, error) {
	br := bufio.NewReaderSize(r, size)
	var long []byte
	return func() ([]byte, error) {
		text, err := br.ReadSlice('\n')
		if !errors.Is(err, bufio.ErrBufferFull) {
			return text, err
		}
		long = append(long[:0], text...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if len(long) > maxLine {
				return nil, errLongLine
			}
			text, err = br.ReadSlice('\n')
			long = append(long, text...)
		}
		return long, err
	}
}

// decode is omni.Decode into m.
func decode(b []byte, m *omni.Message) error {
	if err := omni.Unmarshal(b, m); err != nil {
		return err
	}
	return m.Validate()
}
