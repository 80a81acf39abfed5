package scripted

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

const demoLs = `total 28
drwxr-xr-x  4 ada ada 4096 Nov 29 20:10 .
drwxr-xr-x 12 ada ada 4096 Nov 29 20:09 ..
-rw-r--r--  1 ada ada   42 Nov 29 20:10 .env
drwxr-xr-x  8 ada ada 4096 Nov 29 20:10 .git
-rw-r--r--  1 ada ada  310 Nov 29 20:10 go.mod
-rw-r--r--  1 ada ada 1205 Nov 29 20:10 README.md
drwxr-xr-x  2 ada ada 4096 Nov 29 20:10 cmd
lrwxrwxrwx  1 ada ada    7 Nov 29 20:10 latest -> cmd/run
`

// demoTools is the tool list the engine offers.
var demoTools = []omni.ToolSpec{
	{Name: "exec_command", Description: "Run a command.", Parameters: raw(`{"type":"object"}`)},
	{Name: "read_file", Description: "Read a file.", Parameters: raw(`{"type":"object"}`)},
}

// demoTurn is the model's output of one request, as the engine would put it
// back into the context.
type demoTurn struct {
	msgs  []omni.Message // complete messages, in block order
	calls []omni.Payload
	text  string // all text blocks
	think string // all thinking blocks
	took  time.Duration
}

// playDemo streams one demo request and folds its deltas into messages.
func playDemo(t *testing.T, p *Provider, req *model.Request) demoTurn {
	t.Helper()
	start := time.Now()
	got, res, err := run(t, p, req)
	if err != nil {
		t.Fatalf("demo request: %v", err)
	}
	if res.StopReason != omni.StatusCompleted || res.Usage.Output == 0 || res.Usage.Total <= res.Usage.Output {
		t.Errorf("demo result = %+v, want completed with usage", res)
	}
	checkDiscipline(t, got)
	turn := demoTurn{took: time.Since(start)}
	type block struct {
		typ, name, id string
		content       strings.Builder
	}
	var blocks []*block
	for _, d := range got {
		for len(blocks) <= d.Block {
			blocks = append(blocks, &block{})
		}
		b := blocks[d.Block]
		b.typ = d.Type
		b.content.WriteString(d.Text)
		if d.Name != "" {
			b.name, b.id = d.Name, d.ToolCallID
		}
	}
	for _, b := range blocks {
		switch b.typ {
		case omni.TypeThinking:
			turn.think += b.content.String()
			turn.msgs = append(turn.msgs, omni.Thinking(b.content.String()))
		case omni.TypeText:
			turn.text += b.content.String()
			turn.msgs = append(turn.msgs, omni.Text(omni.RoleAssistant, b.content.String()))
		case omni.TypeToolCall:
			m := omni.ToolCall(b.name, b.content.String(), b.id)
			turn.calls = append(turn.calls, m.Payload)
			turn.msgs = append(turn.msgs, m)
		}
	}
	return turn
}

func TestDemoListsReadsAndAnswers(t *testing.T) {
	p := Demo()
	ids := &model.IDAllocator{}
	ctx := []omni.Message{omni.UserText("What is in this project?")}
	req := func() *model.Request {
		return &model.Request{SessionID: "demo-1", Model: "demo", Messages: refs(ctx...), IDs: ids, Tools: demoTools}
	}
	var total time.Duration

	// 1: think, say so, list the workspace.
	t1 := playDemo(t, p, req())
	total += t1.took
	if want := `The user asked: "What is in this project?"; I'll look at the workspace.`; t1.think != want {
		t.Errorf("thinking = %q, want %q", t1.think, want)
	}
	if t1.text == "" {
		t.Error("request 1 has no text")
	}
	if len(t1.calls) != 1 || t1.calls[0].Name != "exec_command" ||
		t1.calls[0].Arguments != `{"description":"List the workspace","cmd":"ls -la"}` || t1.calls[0].ToolCallID == "" {
		t.Fatalf("request 1 calls = %+v, want exec_command ls -la", t1.calls)
	}
	ctx = append(ctx, t1.msgs...)
	ctx = append(ctx, omni.ToolCallOutput(t1.calls[0].ToolCallID, demoLs, ""))

	// 2: read the README.
	t2 := playDemo(t, p, req())
	total += t2.took
	if len(t2.calls) != 1 || t2.calls[0].Name != "read_file" || t2.calls[0].Arguments != `{"file_path":"README.md","limit":40}` {
		t.Fatalf("request 2 calls = %+v, want read_file README.md", t2.calls)
	}
	if t2.calls[0].ToolCallID == t1.calls[0].ToolCallID {
		t.Errorf("both calls have id %q", t2.calls[0].ToolCallID)
	}
	ctx = append(ctx, t2.msgs...)
	ctx = append(ctx, omni.ToolCallOutput(t2.calls[0].ToolCallID, "     1\t\n     2\t# Floe demo\n     3\t\n     4\tAn agent harness.\n", ""))

	// 3: the answer.
	t3 := playDemo(t, p, req())
	total += t3.took
	if len(t3.calls) != 0 {
		t.Errorf("request 3 calls tools: %+v", t3.calls)
	}
	for _, want := range []string{
		"The workspace has 6 entries: .env, .git/, go.mod, README.md, cmd/, latest.",
		`README.md starts with: "# Floe demo"`,
		"offline demo model", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "FLOE_MODEL", "--model openai:<model>",
	} {
		if !strings.Contains(t3.text, want) {
			t.Errorf("answer lacks %q:\n%s", want, t3.text)
		}
	}
	// Reported, not asserted: wall time on a loaded 2-core machine is noise.
	t.Logf("the demo took %v of model time", total)

	// Deterministic: the same context gives the same answer, and a new
	// Task in the same Session starts over.
	if again := playDemo(t, p, req()); again.text != t3.text {
		t.Errorf("replayed answer differs:\n%s\nvs\n%s", again.text, t3.text)
	}
	ctx = append(ctx, t3.msgs...)
	ctx = append(ctx, omni.UserText("And now?"))
	if t4 := playDemo(t, p, req()); len(t4.calls) != 1 || t4.calls[0].Name != "exec_command" {
		t.Errorf("a new Task calls %+v, want exec_command first", t4.calls)
	}
}

func TestDemoDecisions(t *testing.T) {
	lsCall := omni.ToolCall("exec_command", `{"description":"List the workspace","cmd":"ls -la"}`, "call_1")
	listing := func(lines ...string) string {
		return "total 8\ndrwxr-xr-x 2 u u 4096 Nov 29 20:10 .\ndrwxr-xr-x 3 u u 4096 Nov 29 20:10 ..\n" + strings.Join(lines, "\n") + "\n"
	}
	tests := []struct {
		name     string
		msgs     []omni.Message
		wantCall string // the read_file argument, or "" for an answer
		wantText string // contained in the answer
	}{
		{
			name: "prefers a README",
			msgs: []omni.Message{omni.UserText("hi"), lsCall, omni.ToolCallOutput("call_1", listing(
				"-rw-r--r-- 1 u u 1 Nov 29 20:10 a.txt", "-rw-r--r-- 1 u u 1 Nov 29 20:10 readme.rst"), "")},
			wantCall: `{"file_path":"readme.rst","limit":40}`,
		},
		{
			name: "else the first non-hidden file, spaces kept",
			msgs: []omni.Message{omni.UserText("hi"), lsCall, omni.ToolCallOutput("call_1", listing(
				"-rw-r--r-- 1 u u 1 Nov 29 20:10 .hidden", "drwxr-xr-x 2 u u 4096 Nov 29 20:10 docs",
				"-rw-r--r-- 1 u u 1 Nov 29  2024 my  notes.txt"), "")},
			wantCall: `{"file_path":"my  notes.txt","limit":40}`,
		},
		{
			name: "no file: answers at once",
			msgs: []omni.Message{omni.UserText("hi"), lsCall, omni.ToolCallOutput("call_1", listing(
				"drwxr-xr-x 2 u u 4096 Nov 29 20:10 src", "-rw-r--r-- 1 u u 1 Nov 29 20:10 .gitignore"), "")},
			wantText: "The workspace has 2 entries: src/, .gitignore.",
		},
		{
			name: "many entries are cut",
			msgs: []omni.Message{omni.UserText("hi"), lsCall, omni.ToolCallOutput("call_1", listing(
				"drwxr-xr-x 2 u u 1 Nov 29 20:10 d01", "drwxr-xr-x 2 u u 1 Nov 29 20:10 d02", "drwxr-xr-x 2 u u 1 Nov 29 20:10 d03",
				"drwxr-xr-x 2 u u 1 Nov 29 20:10 d04", "drwxr-xr-x 2 u u 1 Nov 29 20:10 d05", "drwxr-xr-x 2 u u 1 Nov 29 20:10 d06",
				"drwxr-xr-x 2 u u 1 Nov 29 20:10 d07", "drwxr-xr-x 2 u u 1 Nov 29 20:10 d08", "drwxr-xr-x 2 u u 1 Nov 29 20:10 d09",
				"drwxr-xr-x 2 u u 1 Nov 29 20:10 d10", "drwxr-xr-x 2 u u 1 Nov 29 20:10 d11", "drwxr-xr-x 2 u u 1 Nov 29 20:10 d12",
				"drwxr-xr-x 2 u u 1 Nov 29 20:10 d13", "drwxr-xr-x 2 u u 1 Nov 29 20:10 d14"), "")},
			wantText: "The workspace has 14 entries: d01/, d02/, d03/, d04/, d05/, d06/, d07/, d08/, d09/, d10/, d11/, d12/, and 2 more.",
		},
		{
			name:     "empty workspace",
			msgs:     []omni.Message{omni.UserText("hi"), lsCall, omni.ToolCallOutput("call_1", listing(), "")},
			wantText: "The workspace is empty.",
		},
		{
			name:     "denied listing",
			msgs:     []omni.Message{omni.UserText("hi"), lsCall, omni.ToolCallOutput("call_1", omni.DeniedByUser, omni.StatusAborted)},
			wantText: `I couldn't list the workspace: "Tool call denied by user."`,
		},
		{
			name: "failed read",
			msgs: []omni.Message{omni.UserText("hi"), lsCall,
				omni.ToolCallOutput("call_1", listing("-rw-r--r-- 1 u u 1 Nov 29 20:10 a.bin"), ""),
				omni.ToolCall("read_file", `{"file_path":"a.bin","limit":40}`, "call_2"),
				omni.ToolCallOutput("call_2", "a.bin looks like a binary file (it contains NUL bytes); read_file only reads text", omni.StatusFailed)},
			wantText: `I couldn't read a.bin: "a.bin looks like a binary file`,
		},
		{
			name: "empty file",
			msgs: []omni.Message{omni.UserText("hi"), lsCall,
				omni.ToolCallOutput("call_1", listing("-rw-r--r-- 1 u u 0 Nov 29 20:10 README"), ""),
				omni.ToolCall("read_file", `{"file_path":"README","limit":40}`, "call_2"),
				omni.ToolCallOutput("call_2", "[empty file]", "")},
			wantText: "The workspace has 1 entry: README.\nREADME is empty.",
		},
		{
			name: "retry and steering blocks do not start a new Task",
			msgs: []omni.Message{omni.UserText("hi"), lsCall,
				omni.UserText(omni.Block(omni.TagTurnRetried, "request failed")),
				omni.ToolCallOutput("call_1", listing("-rw-r--r-- 1 u u 1 Nov 29 20:10 go.mod"), ""),
				omni.UserText(omni.Block(omni.TagUserSteering, "be quick"))},
			wantCall: `{"file_path":"go.mod","limit":40}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := newReq("s", tt.msgs...)
			req.Tools = demoTools
			turn := playDemo(t, Demo(), req)
			if tt.wantCall != "" {
				if len(turn.calls) != 1 || turn.calls[0].Name != "read_file" || turn.calls[0].Arguments != tt.wantCall {
					t.Errorf("calls = %+v, want read_file %s", turn.calls, tt.wantCall)
				}
				return
			}
			if len(turn.calls) != 0 || !strings.Contains(turn.text, tt.wantText) || !strings.Contains(turn.text, "OPENAI_API_KEY") {
				t.Errorf("turn = %+v, want an answer containing %q and the configuration hint", turn, tt.wantText)
			}
		})
	}
}

func TestDemoOnlyCallsOfferedTools(t *testing.T) {
	// No prompt at all.
	if got := demoThinking("  "); got != "There is no question yet; I'll look at the workspace." {
		t.Errorf("demoThinking(blank) = %q", got)
	}
	if got := demoThinking(strings.Repeat("long ", 40)); !strings.HasSuffix(got, `…"; I'll look at the workspace.`) {
		t.Errorf("demoThinking(long) = %q, want the prompt cut", got)
	}
	// No tools: answer at once.
	turn := playDemo(t, Demo(), newReq("s", omni.UserText("hi")))
	if len(turn.calls) != 0 || !strings.Contains(turn.text, "not offered the exec_command tool") {
		t.Errorf("without tools: %+v, want an answer saying exec_command is missing", turn)
	}
	// exec_command only: list, then answer without reading.
	req := newReq("s", omni.UserText("hi"))
	req.Tools = demoTools[:1]
	turn = playDemo(t, Demo(), req)
	if len(turn.calls) != 1 || turn.calls[0].Name != "exec_command" {
		t.Fatalf("first request calls %+v, want exec_command", turn.calls)
	}
	req.Messages = append(append(req.Messages, refs(turn.msgs...)...), refs(omni.ToolCallOutput(turn.calls[0].ToolCallID, demoLs, ""))...)
	turn = playDemo(t, Demo(), req)
	if len(turn.calls) != 0 || !strings.Contains(turn.text, "The workspace has 6 entries") {
		t.Errorf("without read_file: %+v, want the answer", turn)
	}
}

// The demo reads a real ls -la listing.
func TestDemoReadsRealListing(t *testing.T) {
	ls, err := exec.LookPath("ls")
	if err != nil {
		t.Skip("no ls")
	}
	dir := t.TempDir()
	for _, name := range []string{"b.go", "README.md", "with space.txt"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("b.go", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, style := range []string{"", "--time-style=long-iso", "--time-style=full-iso"} {
		args := []string{"-la"}
		if style != "" {
			args = append(args, style)
		}
		cmd := exec.Command(ls, args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Skipf("ls %v: %v", args, err)
		}
		entries := parseListing(string(out))
		got := listNames(entries)
		if want := "README.md, b.go, link, sub/, with space.txt"; !sameNames(got, want) {
			t.Errorf("ls %v: entries %q, want %q; listing:\n%s", args, got, want, out)
		}
		if f := pickFile(entries); f != "README.md" {
			t.Errorf("ls %v: picked %q, want README.md", args, f)
		}
	}
}

// sameNames compares comma-separated name lists ignoring order (ls sorts by
// locale).
func sameNames(a, b string) bool {
	split := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, n := range strings.Split(s, ", ") {
			m[n] = true
		}
		return m
	}
	return fmt.Sprint(split(a)) == fmt.Sprint(split(b))
}

func TestParseListingLine(t *testing.T) {
	tests := []struct {
		line string
		name string
		mode byte
		ok   bool
	}{
		{"-rw-r--r--  1 ada ada 1205 Nov 29 20:10 README.md", "README.md", '-', true},
		{"-rw-r--r--. 1 ada ada 1205 Nov 29  2024 two  spaces", "two  spaces", '-', true},
		{"-rw-r--r--+ 1 ada ada 1205 2026-11-29 20:10 iso.txt", "iso.txt", '-', true},
		{"-rw-r--r-- 1 ada ada 1205 2026-11-29 20:10:22.123456789 +0000 full.txt", "full.txt", '-', true},
		{"lrwxrwxrwx 1 ada ada 7 Nov 29 20:10 latest -> cmd/run", "latest", 'l', true},
		{"crw-rw-rw- 1 root root 1, 3 Nov 29 20:10 null", "null", 'c', true},
		{"drwxrwxrwt 2 root root 4096 Nov 29 20:10 tmp", "tmp", 'd', true},
		{"total 28", "", 0, false},
		{"[exit code: 2]", "", 0, false},
		{"ls: cannot access 'x': No such file or directory", "", 0, false},
		{"-rw-r--r-- 1 ada ada 1205 Nov 29", "", 0, false},
	}
	for _, tt := range tests {
		e, ok := parseListingLine(tt.line)
		if ok != tt.ok || e.name != tt.name || e.mode != tt.mode {
			t.Errorf("parseListingLine(%q) = %q %q %v, want %q %q %v", tt.line, e.name, e.mode, ok, tt.name, tt.mode, tt.ok)
		}
	}
}
