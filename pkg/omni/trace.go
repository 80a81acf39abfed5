package omni

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// TraceDir returns $FLOE_HOME/traces/<yyyy-mm-dd> for a Session created at created.
func TraceDir(home string, created time.Time) string {
	return filepath.Join(home, "traces", created.UTC().Format("2006-01-02"))
}

// TraceFile returns the path of a Session's Trace file number index (1-based).
func TraceFile(home string, created time.Time, sessionID string, index int) string {
	return filepath.Join(TraceDir(home, created), fmt.Sprintf("%s_%03d.jsonl", sessionID, index))
}

var sessionIDRe = regexp.MustCompile(`^session-(\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2})-[0-9a-f]{8}$`)

// SessionCreated returns the creation time encoded in a Session id of the
// form session-YYYY-MM-DD-HH-mm-ss-<8hex>.
func SessionCreated(sessionID string) (time.Time, bool) {
	m := sessionIDRe.FindStringSubmatch(sessionID)
	if m == nil {
		return time.Time{}, false
	}
	t, err := time.Parse("2006-01-02-15-04-05", m[1])
	return t, err == nil
}

// NewSessionID returns a Session id for a Session created at t; rand8 is
// eight lower-case hex digits.
func NewSessionID(t time.Time, rand8 string) string {
	return "session-" + t.UTC().Format("2006-01-02-15-04-05") + "-" + rand8
}

// TraceIndexOf parses the index of a Trace file name <sid>_<nnn>.jsonl.
func TraceIndexOf(name, sessionID string) (int, bool) {
	base := filepath.Base(name)
	prefix := sessionID + "_"
	if len(base) < len(prefix)+len(".jsonl")+1 || base[:len(prefix)] != prefix || filepath.Ext(base) != ".jsonl" {
		return 0, false
	}
	digits := base[len(prefix) : len(base)-len(".jsonl")]
	for i := range len(digits) {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false // Atoi would take a sign
		}
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil && n > 0
}

// TraceLineError describes a Trace line that was skipped.
type TraceLineError struct {
	Line int  // 1-based line number
	Torn bool // the last line, without its newline: a write cut short by a crash
	Err  error
}

func (e *TraceLineError) Error() string {
	if e.Torn {
		return fmt.Sprintf("trace line %d: torn last line: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("trace line %d: %v", e.Line, e.Err)
}

func (e *TraceLineError) Unwrap() error { return e.Err }

// ReadTrace reads the records of one Trace file. Malformed lines (a torn last
// line, a garbage middle line) are skipped and reported in skipped; err is
// only an I/O error. Lines may be up to 64 MiB long.
func ReadTrace(r io.Reader) (msgs []Message, skipped []*TraceLineError, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	line := 0
	var buf []byte
	for {
		chunk, rerr := br.ReadSlice('\n')
		buf = append(buf, chunk...)
		if rerr == bufio.ErrBufferFull {
			if len(buf) > 64<<20 {
				return msgs, skipped, fmt.Errorf("trace line %d: longer than 64 MiB", line+1)
			}
			continue
		}
		if len(buf) > 0 {
			line++
			complete := buf[len(buf)-1] == '\n'
			text := bytes.TrimSpace(buf)
			if len(text) > 0 {
				var m Message
				derr := Unmarshal(text, &m)
				if derr == nil {
					derr = m.Validate()
				}
				if derr != nil {
					skipped = append(skipped, &TraceLineError{Line: line, Torn: !complete && rerr == io.EOF, Err: derr})
				} else {
					msgs = append(msgs, m)
				}
			}
			buf = buf[:0]
		}
		if rerr == io.EOF {
			return msgs, skipped, nil
		}
		if rerr != nil {
			return msgs, skipped, rerr
		}
	}
}
