package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"

	"github.com/chzyer/readline"
)

// inputKind is what the terminal reports.
type inputKind int

const (
	inLine      inputKind = iota // a submitted line
	inInterrupt                  // Ctrl-C (text: what the line held)
	inEOF                        // Ctrl-D on an empty line, or the end of piped input
)

type inputEvent struct {
	kind inputKind
	text string
}

// console is where `floe chat` reads lines and writes the stream: a
// line editor on a terminal, plain lines otherwise.
type console interface {
	io.Writer
	// Events delivers lines, interrupts and the end of input.
	Events() <-chan inputEvent
	// SetPrompt sets the prompt shown while the editor waits.
	SetPrompt(p string)
	// SetStatus shows a transient line (a retry's countdown) in front of
	// the prompt until the next status or output; plain consoles ignore it.
	SetStatus(s string)
	// Interactive reports a line editor (prompts shown, input echoed by
	// the editor itself).
	Interactive() bool
	Close()
}

// plainConsole reads stdin line by line and writes stdout as it comes:
// `floe chat < script.txt`.
type plainConsole struct {
	w      io.Writer
	events chan inputEvent
}

func newPlainConsole(in io.Reader, out io.Writer) *plainConsole {
	c := &plainConsole{w: out, events: make(chan inputEvent)}
	go func() {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.events <- inputEvent{kind: inLine, text: sc.Text()}
		}
		c.events <- inputEvent{kind: inEOF}
	}()
	return c
}

func (c *plainConsole) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c *plainConsole) Events() <-chan inputEvent   { return c.events }
func (c *plainConsole) SetPrompt(string)            {}
func (c *plainConsole) SetStatus(string)            {}
func (c *plainConsole) Interactive() bool           { return false }
func (c *plainConsole) Close()                      {}

// ttyConsole is the line editor (github.com/chzyer/readline): history
// with up/down, editing keys, Ctrl-C and Ctrl-D as events. Output never
// scribbles over what the user is typing: complete lines are written
// above the prompt, the line still streaming is shown in front of the
// prompt, and while the user has typed something the output is held and
// written once the line is submitted or cleared (as the original
// harness's chat does).
type ttyConsole struct {
	rl     *readline.Instance
	stdin  *readline.CancelableStdin
	out    io.Writer // rl.Stdout(): redraws the prompt after each write
	events chan inputEvent

	mu     sync.Mutex
	prompt string       // the prompt proper ("> ", an approval question)
	tail   string       // the output line still open, shown before the prompt
	status string       // a transient status, shown before the prompt
	typing bool         // the edit buffer is not empty
	held   bytes.Buffer // output held while typing
	closed bool
	// Typing changes are numbered as readline reports them and applied
	// in that order: a late keystroke's change never undoes the submit
	// that followed it (which would hold the output with nothing typed).
	typingSeq atomic.Uint64
	applied   uint64 // guarded by mu: the last change applied
}

func newTTYConsole() (*ttyConsole, error) {
	c := &ttyConsole{events: make(chan inputEvent), stdin: readline.NewCancelableStdin(os.Stdin)}
	rl, err := readline.NewEx(&readline.Config{
		Prompt:          "> ",
		HistoryLimit:    500,
		InterruptPrompt: "^C",
		EOFPrompt:       "\n", // none
		Listener:        c,
		// A cancelable stdin we close ourselves: readline v1.5.1's Close
		// does not, and waits for a key press.
		Stdin:  c.stdin,
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	})
	if err != nil {
		return nil, err
	}
	c.rl = rl
	c.out = rl.Stdout()
	c.prompt = "> "
	go c.read()
	return c, nil
}

func (c *ttyConsole) read() {
	for {
		line, err := c.rl.Readline()
		c.setTyping(c.typingSeq.Add(1), false)
		switch {
		case err == nil:
			c.events <- inputEvent{kind: inLine, text: line}
		case errors.Is(err, readline.ErrInterrupt):
			c.events <- inputEvent{kind: inInterrupt, text: line}
		case errors.Is(err, io.EOF):
			c.events <- inputEvent{kind: inEOF}
		default:
			c.events <- inputEvent{kind: inEOF}
			return
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
	}
}

// OnChange is readline's Listener: it tells whether the user is typing.
func (c *ttyConsole) OnChange(line []rune, _ int, _ rune) ([]rune, int, bool) {
	typing := len(line) > 0
	seq := c.typingSeq.Add(1)
	go c.setTyping(seq, typing) // readline is mid-keystroke: redraw later
	return nil, 0, false
}

func (c *ttyConsole) setTyping(seq uint64, typing bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq < c.applied {
		return // a later change is in
	}
	c.applied = seq
	if c.typing == typing {
		return
	}
	c.typing = typing
	if !typing && c.held.Len() > 0 {
		b := c.held.Bytes()
		c.held.Reset()
		c.writeLocked(b)
	}
	c.refreshLocked()
}

func (c *ttyConsole) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.typing {
		return c.held.Write(p)
	}
	c.status = ""
	c.writeLocked(p)
	c.refreshLocked()
	return len(p), nil
}

func (c *ttyConsole) SetStatus(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status == s {
		return
	}
	c.status = s
	c.refreshLocked()
}

// writeLocked writes the complete lines of tail+p above the prompt and
// keeps the rest as the new tail.
func (c *ttyConsole) writeLocked(p []byte) {
	s := c.tail + string(p)
	i := strings.LastIndexByte(s, '\n')
	if i < 0 {
		c.tail = s
		return
	}
	c.tail = s[i+1:]
	io.WriteString(c.out, s[:i+1])
}

func (c *ttyConsole) refreshLocked() {
	p := c.prompt
	if !c.typing {
		room := readline.GetScreenWidth() - textWidth(c.status) - textWidth(p) - 1
		p = tailPreview(c.tail, room) + c.status + p
	} else if c.prompt == "" {
		p = "steer> "
	}
	c.rl.SetPrompt(p)
	c.rl.Refresh()
}

// tailPreview is what the prompt row shows of the output line still
// streaming: its end, in at most room columns, without escapes, tabs as
// spaces. The editor's prompt must stay on one row: a prompt wider than
// the terminal is redrawn a row lower each time, leaving a copy of the
// line on the screen per redraw. The whole line is written once, above
// the prompt, when it ends.
func tailPreview(tail string, room int) string {
	if tail == "" {
		return ""
	}
	t := ansiSeq.ReplaceAllString(tail, "")
	t = strings.ReplaceAll(t, "\t", "    ")
	t = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return -1
		}
		return r
	}, t)
	if room < 2 {
		return ""
	}
	if textWidth(t) <= room {
		return t
	}
	rs := []rune(t)
	w := 1 // the ellipsis
	i := len(rs)
	for i > 0 && w+runeWidth(rs[i-1]) <= room {
		i--
		w += runeWidth(rs[i])
	}
	return "…" + string(rs[i:])
}

var ansiSeq = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]`)

// textWidth is the terminal columns s takes (escapes take none).
func textWidth(s string) int {
	n := 0
	for _, r := range ansiSeq.ReplaceAllString(s, "") {
		n += runeWidth(r)
	}
	return n
}

// runeWidth: 2 for the wide East Asian and emoji ranges, 0 for combining
// marks, else 1.
func runeWidth(r rune) int {
	switch {
	case r < ' ':
		return 0
	case unicode.Is(unicode.Mn, r):
		return 0
	case r >= 0x1100 && (r <= 0x115f || r == 0x2329 || r == 0x232a ||
		(r >= 0x2e80 && r <= 0xa4cf && r != 0x303f) || (r >= 0xac00 && r <= 0xd7a3) ||
		(r >= 0xf900 && r <= 0xfaff) || (r >= 0xfe30 && r <= 0xfe4f) || (r >= 0xff00 && r <= 0xff60) ||
		(r >= 0xffe0 && r <= 0xffe6) || (r >= 0x1f300 && r <= 0x1f64f) || (r >= 0x1f900 && r <= 0x1f9ff) ||
		(r >= 0x20000 && r <= 0x3fffd)):
		return 2
	}
	return 1
}

func (c *ttyConsole) Events() <-chan inputEvent { return c.events }

func (c *ttyConsole) SetPrompt(p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prompt = p
	c.refreshLocked()
}

func (c *ttyConsole) Interactive() bool { return true }

func (c *ttyConsole) Close() {
	c.mu.Lock()
	c.closed = true
	if c.held.Len() > 0 {
		c.writeLocked(c.held.Bytes())
		c.held.Reset()
	}
	tail := c.tail
	c.tail = ""
	c.prompt = ""
	c.rl.SetPrompt("")
	c.mu.Unlock()
	c.rl.Clean()
	if tail != "" {
		io.WriteString(os.Stdout, tail+"\n")
	}
	c.stdin.Close()
	c.rl.Close()
}
