package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"floe.dev/services/engine"
)

// ptyProc is floe running on a pseudo-terminal: what a user at a
// terminal sees and types.
type ptyProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	tty  *os.File
	mu   sync.Mutex
	out  bytes.Buffer
	pos  int // expect searches from here
	done chan struct{}
	read chan struct{} // closed when the terminal has no more output
	code int
}

// bound bounds every wait of these tests.
var bound = 60 * time.Second

func startPTY(t *testing.T, dir string, env []string, args ...string) *ptyProc {
	t.Helper()
	cmd := exec.Command(buildFloe(t), args...)
	cmd.Dir = dir
	cmd.Env = env
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 50, Cols: 250})
	if err != nil {
		t.Fatalf("pty: %v", err)
	}
	p := &ptyProc{t: t, cmd: cmd, tty: tty, done: make(chan struct{}), read: make(chan struct{})}
	go func() {
		defer close(p.read)
		buf := make([]byte, 4096)
		for {
			n, err := tty.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() {
		err := cmd.Wait()
		p.code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -1
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			if os.Getenv("FLOE_TEST_DUMP") != "" { // a hang: show the goroutines
				_ = cmd.Process.Signal(syscall.SIGQUIT)
				select {
				case <-p.done:
				case <-time.After(2 * time.Second):
				}
			}
			_ = cmd.Process.Kill()
			<-p.done
		}
		tty.Close()
		if t.Failed() {
			t.Logf("terminal output:\n%s", p.screen())
		}
	})
	return p
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\r`)

// screen is the output so far without escape sequences.
func (p *ptyProc) screen() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ansi.ReplaceAllString(p.out.String(), "")
}

// expect waits until want appears after the previous match.
func (p *ptyProc) expect(want string) {
	p.t.Helper()
	deadline := time.Now().Add(bound)
	for {
		s := p.screen()
		if p.pos > len(s) {
			p.pos = len(s)
		}
		if i := strings.Index(s[p.pos:], want); i >= 0 {
			p.pos += i + len(want)
			return
		}
		select {
		case <-p.done:
			p.drain()
			if s := p.screen(); !strings.Contains(s[p.pos:], want) {
				p.t.Fatalf("floe exited (status %d) before printing %q", p.code, want)
			}
			continue
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("no %q within %v", want, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *ptyProc) send(s string) {
	p.t.Helper()
	if _, err := p.tty.WriteString(s); err != nil {
		p.t.Fatalf("write to the terminal: %v", err)
	}
}

// wait waits for the exit and returns the status.
func (p *ptyProc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
		p.drain()
		return p.code
	case <-time.After(bound):
		p.t.Fatalf("floe did not exit within %v", bound)
		return -1
	}
}

// writeScript writes a scripted model's script and returns its model ref.
func writeScript(t *testing.T, dir, script string) string {
	t.Helper()
	path := filepath.Join(dir, "script.json")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	return "scripted:" + path
}

// chatEnv is a fresh machine's environment for a chat in home: no colour
// (the assertions read text), a workspace, quick retries.
func chatEnv(t *testing.T) (home, ws string, env []string) {
	home = t.TempDir()
	ws = filepath.Join(home, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	return home, ws, append(cleanEnv(home), "NO_COLOR=1", "TERM=xterm")
}

// fakeOpenAI is an OpenAI-compatible Chat Completions server: request n
// is answered with the text "answer <n>" (1-based); every body is kept.
// The engine's title requests (engine.TitleInstruction) are answered
// "Fake title <n>" and kept apart, outside that count.
type fakeOpenAI struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []fakeRequest
	titles []fakeRequest
}

// isTitle reports whether r is the engine's title request.
func (r fakeRequest) isTitle() bool {
	if len(r.Messages) != 1 {
		return false
	}
	var s string
	_ = json.Unmarshal(r.Messages[0].Content, &s)
	return strings.HasPrefix(s, engine.TitleInstruction)
}

type fakeRequest struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// texts is the request's messages as "role: text" lines.
func (r fakeRequest) texts() []string {
	var out []string
	for _, m := range r.Messages {
		var s string
		_ = json.Unmarshal(m.Content, &s)
		out = append(out, m.Role+": "+s)
	}
	return out
}

func newFakeOpenAI(t *testing.T) *fakeOpenAI {
	f := &fakeOpenAI{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req fakeRequest
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("fake openai: body: %v", err)
		}
		answer := "answer %d"
		f.mu.Lock()
		if req.isTitle() {
			f.titles = append(f.titles, req)
			answer = "Fake title %d"
		} else {
			f.bodies = append(f.bodies, req)
		}
		n := len(f.bodies)
		if req.isTitle() {
			n = len(f.titles)
		}
		f.mu.Unlock()
		head := `{"id":"chatcmpl-fake","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","choices":[{"index":0,"delta":`
		chunks := []string{
			head + `{"role":"assistant","content":""},"finish_reason":null}]}`,
			head + fmt.Sprintf(`{"content":"`+answer+`"},"finish_reason":null}]}`, n),
			head + `{},"finish_reason":"stop"}]}`,
			`{"id":"chatcmpl-fake","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`,
			"[DONE]",
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range chunks {
			fmt.Fprintf(w, "data: %s\n\n", c)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeOpenAI) request(t *testing.T, i int) fakeRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.bodies) {
		t.Fatalf("request %d never arrived (%d did)", i+1, len(f.bodies))
	}
	return f.bodies[i]
}

// waitTitles waits until n title requests arrived.
func (f *fakeOpenAI) waitTitles(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		f.mu.Lock()
		got := len(f.titles)
		f.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d title requests after 30 s, want %d", got, n)
		}
	}
}

// titleRequest returns title request i.
func (f *fakeOpenAI) titleRequest(t *testing.T, i int) fakeRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.titles) {
		t.Fatalf("title request %d never arrived (%d did)", i+1, len(f.titles))
	}
	return f.titles[i]
}

func (f *fakeOpenAI) env() []string {
	return []string{"OPENAI_BASE_URL=" + f.URL + "/v1", "OPENAI_API_KEY=sk-fake", "FLOE_MODEL=openai:gpt-4o-mini"}
}

var sessionRe = regexp.MustCompile(`session (session-[0-9a-z-]+)`)

// runPiped runs floe with stdin from a string (no terminal).
func runPiped(t *testing.T, dir string, env []string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, buildFloe(t), args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("floe %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// drain waits (bounded) for the output written before the exit.
func (p *ptyProc) drain() {
	select {
	case <-p.read:
	case <-time.After(2 * time.Second):
	}
}

// terminalScreen replays raw terminal output on a cols-wide screen (the
// subset of VT100 a line editor uses: CR, LF, BS, cursor up/down/left/
// right, erase in line and below, colours ignored) and returns its lines
// with trailing blanks trimmed: what a user would see.
func terminalScreen(raw string, cols int) []string {
	var screen [][]rune
	row, col := 0, 0
	line := func() []rune {
		for len(screen) <= row {
			screen = append(screen, nil)
		}
		return screen[row]
	}
	put := func(r rune) {
		if col >= cols {
			row, col = row+1, 0
		}
		l := line()
		for len(l) <= col {
			l = append(l, ' ')
		}
		l[col] = r
		screen[row] = l
		col++
	}
	rs := []rune(raw)
	for i := 0; i < len(rs); i++ {
		switch r := rs[i]; {
		case r == '\r':
			col = 0
		case r == '\n':
			row++
			line()
		case r == '\b':
			if col > 0 {
				col--
			}
		case r == 0x1b && i+1 < len(rs) && rs[i+1] == '[':
			j := i + 2
			for j < len(rs) && (rs[j] >= '0' && rs[j] <= '9' || rs[j] == ';' || rs[j] == '?') {
				j++
			}
			if j >= len(rs) {
				i = j
				break
			}
			n := 0
			fmt.Sscanf(string(rs[i+2:j]), "%d", &n)
			step := max(n, 1)
			switch rs[j] {
			case 'A':
				row = max(row-step, 0)
			case 'B':
				row += step
			case 'C':
				col += step
			case 'D':
				col = max(col-step, 0)
			case 'K':
				l := line()
				switch n {
				case 0:
					if col < len(l) {
						screen[row] = l[:col]
					}
				case 2:
					screen[row] = nil
				}
			case 'J':
				l := line()
				if col < len(l) {
					screen[row] = l[:col]
				}
				screen = screen[:row+1]
			}
			i = j
		case r == 0x1b:
			i++ // a two-character escape
		case r < ' ':
		default:
			put(r)
		}
	}
	out := make([]string, len(screen))
	for i, l := range screen {
		out[i] = strings.TrimRight(string(l), " ")
	}
	return out
}

// rawOutput is everything written so far, escapes included.
func (p *ptyProc) rawOutput() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}
