package tools

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// NoOutput is the whole Output of a call that produced no output at all.
const NoOutput = "[no output]"

// TruncationMarker returns the marker that replaces the dropped end of an
// output part longer than Options.MaxOutput characters:
// "[output truncated: N more characters]", N counting the dropped runes. It
// stands on its own line after the kept head, for example
// "aaaa\n[output truncated: 104841600 more characters]".
func TruncationMarker(dropped int64) string {
	return "[output truncated: " + strconv.FormatInt(dropped, 10) + " more characters]"
}

// ExitCodeNote returns the note exec_command adds on its own line when a
// command exits with a non-zero code: "[exit code: 2]".
func ExitCodeNote(code int) string { return "[exit code: " + strconv.Itoa(code) + "]" }

// TimeoutNote returns the note Execute adds on its own line when a call runs
// out of time: "[timed out after 1.5s]", the duration in time.Duration
// notation.
func TimeoutNote(d time.Duration) string { return "[timed out after " + d.String() + "]" }

// signalNote is exec_command's note for a command killed by a signal it was
// not sent by us: "[killed by signal: segmentation fault]".
func signalNote(sig string) string { return "[killed by signal: " + sig + "]" }

// canceledNote is Execute's note for a call whose caller's context ended:
// "[canceled]" or "[canceled: <cause>]".
func canceledNote(cause error) string {
	if cause == nil || errors.Is(cause, context.Canceled) {
		return "[canceled]"
	}
	return "[canceled: " + cause.Error() + "]"
}

// output builds one call's Output while streaming it to the caller's Emit.
//
// Output is made of parts (what the tool emitted, what it returned), each
// keeping at most max characters followed, if anything was dropped, by a
// TruncationMarker; then notes. Only the kept head of a part is stored, so
// memory stays bounded however much a tool produces.
type output struct {
	mu      sync.Mutex // guards the fields below; held while calling emit so fragments stay in order
	emit    Emit
	max     int
	sb      strings.Builder // everything emitted so far: the Output
	kept    int             // characters kept in the current part
	dropped int64           // characters dropped from the current part
	partial string          // an incomplete UTF-8 sequence held back until more bytes arrive
	closed  bool            // the tool's Run returned; its late fragments are dropped
}

func newOutput(max int, emit Emit) *output {
	if emit == nil {
		emit = func(string) {}
	}
	return &output{emit: emit, max: max}
}

// toolEmit is the Emit handed to Tool.Run.
func (o *output) toolEmit(s string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	o.write(s)
}

// write adds s to the current part, holding back a rune split across
// fragments. mu must be held.
func (o *output) write(s string) {
	if o.partial != "" {
		s = o.partial + s
		o.partial = ""
	}
	s, o.partial = splitIncomplete(s)
	o.add(s)
}

// add caps s into the current part. mu must be held.
func (o *output) add(s string) {
	if s == "" {
		return
	}
	if o.dropped > 0 || o.kept >= o.max {
		o.dropped += int64(utf8.RuneCountInString(s))
		return
	}
	s = strings.ToValidUTF8(s, string(utf8.RuneError))
	room := o.max - o.kept
	i, n := 0, 0
	for i < len(s) && n < room {
		_, w := utf8.DecodeRuneInString(s[i:])
		i += w
		n++
	}
	o.kept += n
	o.send(s[:i])
	if i < len(s) {
		o.dropped += int64(utf8.RuneCountInString(s[i:]))
	}
}

// endPart flushes a held-back sequence, adds the truncation marker if
// anything was dropped and starts a new part. mu must be held.
func (o *output) endPart() {
	if o.partial != "" {
		p := o.partial
		o.partial = ""
		o.add(p)
	}
	if o.dropped > 0 {
		o.note(TruncationMarker(o.dropped))
	}
	o.kept, o.dropped = 0, 0
}

// lineStart ends the current line unless the output is empty or already at
// the start of a line. mu must be held.
func (o *output) lineStart() {
	if o.sb.Len() > 0 && !strings.HasSuffix(o.sb.String(), "\n") {
		o.send("\n")
	}
}

// note adds s on its own line, uncapped. mu must be held.
func (o *output) note(s string) {
	if o.sb.Len() > 0 && !strings.HasSuffix(o.sb.String(), "\n") {
		s = "\n" + s
	}
	o.send(s)
}

// send emits s and records it. mu must be held.
func (o *output) send(s string) {
	if s == "" {
		return
	}
	o.sb.WriteString(s)
	o.emit(s)
}

// finish closes the tool's emit, appends the tool's returned text and the
// notes, and returns the Output.
func (o *output) finish(returned string, notes ...string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	o.endPart()
	if returned != "" {
		o.lineStart()
		o.write(returned)
		o.endPart()
	}
	for _, n := range notes {
		o.note(n)
	}
	if o.sb.Len() == 0 {
		o.send(NoOutput)
	}
	return o.sb.String()
}

// splitIncomplete splits s before a trailing UTF-8 sequence that is the
// valid start of a rune but lacks its last bytes.
func splitIncomplete(s string) (complete, partial string) {
	for i := len(s) - 1; i >= 0 && i >= len(s)-(utf8.UTFMax-1); i-- {
		c := s[i]
		if c < utf8.RuneSelf {
			return s, ""
		}
		if utf8.RuneStart(c) {
			if utf8.FullRuneInString(s[i:]) {
				return s, ""
			}
			return s[:i], s[i:]
		}
	}
	return s, ""
}
