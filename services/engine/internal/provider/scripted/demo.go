package scripted

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// demoDelay is the pause before each delta of the demo, so streaming is
// visible in a terminal.
const demoDelay = 15 * time.Millisecond

// demoMaxChunks bounds the deltas of one demo block, which bounds the
// demo's model time: a Task streams at most ~30 deltas, under half a second.
const demoMaxChunks = 12

// demoHint is the last paragraph of every demo answer.
const demoHint = "This is Floe's offline demo model (scripted:demo): it only lists the workspace and reads one file. " +
	"To use a real model, set OPENAI_API_KEY or ANTHROPIC_API_KEY, " +
	"or choose one with FLOE_MODEL or --model openai:<model> (or anthropic:<model>)."

// Demo returns the built-in "scripted:demo" model: it lists the workspace,
// reads one file and answers with a summary and a note on configuring a
// real model. Each answer is decided from the request's messages alone.
func Demo() *Provider {
	return &Provider{name: DemoName, contextWindow: DefaultContextWindow, plan: planDemo}
}

// demoTask is what the demo sees of the current Task.
type demoTask struct {
	prompt  string
	calls   []omni.Payload          // tool calls, in order
	outputs map[string]omni.Payload // tool_call_output by tool_call_id
}

// readDemoTask collects the Task that starts at the last user text that is
// not a system block.
func readDemoTask(msgs []*omni.Message) demoTask {
	start := 0
	for i := len(msgs) - 1; i >= 0; i-- {
		pl := &msgs[i].Payload
		if pl.Type == omni.TypeText && pl.Role == omni.RoleUser && !isSystemBlock(pl.Text) {
			start = i
			break
		}
	}
	t := demoTask{outputs: map[string]omni.Payload{}}
	for _, m := range msgs[start:] {
		pl := m.Payload
		switch pl.Type {
		case omni.TypeText:
			if pl.Role == omni.RoleUser && t.prompt == "" && !isSystemBlock(pl.Text) {
				t.prompt = pl.Text
			}
		case omni.TypeToolCall:
			t.calls = append(t.calls, pl)
		case omni.TypeToolCallOutput:
			t.outputs[pl.ToolCallID] = pl
		}
	}
	return t
}

func isSystemBlock(text string) bool {
	for _, tag := range []string{omni.TagTurnRetried, omni.TagTurnAborted, omni.TagUserSteering, omni.TagSummary, omni.TagContextSummary} {
		if strings.HasPrefix(text, "["+tag+"]") {
			return true
		}
	}
	return false
}

// lastCall returns the last tool call named name and its output.
func (t *demoTask) lastCall(name string) (c, out omni.Payload, ok bool) {
	for i := len(t.calls) - 1; i >= 0; i-- {
		if t.calls[i].Name == name {
			return t.calls[i], t.outputs[t.calls[i].ToolCallID], true
		}
	}
	return c, out, false
}

// planDemo decides the demo's next request.
func planDemo(req *model.Request) *entry {
	t := readDemoTask(req.Messages)
	_, lsOut, listed := t.lastCall("exec_command")
	if !listed && !offered(req, "exec_command") {
		return demoEntry(demoStep(stepText,
			"I was not offered the exec_command tool, so I cannot look at the workspace.\n\n"+demoHint))
	}
	if !listed {
		return demoEntry(
			demoStep(stepThinking, demoThinking(t.prompt)),
			demoStep(stepText, "I'm Floe's offline demo model. Let me list the workspace first."),
			demoCall("exec_command", `{"description":"List the workspace","cmd":"ls -la"}`),
		)
	}
	entries := parseListing(lsOut.Output)
	readCall, readOut, read := t.lastCall("read_file")
	if !read && lsOut.Stop() == omni.StatusCompleted && offered(req, "read_file") {
		if file := pickFile(entries); file != "" {
			args, _ := json.Marshal(struct {
				FilePath string `json:"file_path"`
				Limit    int    `json:"limit"`
			}{file, 40}) // cannot fail
			return demoEntry(
				demoStep(stepText, "Let me read "+file+"."),
				demoCall("read_file", string(args)),
			)
		}
	}
	var answer strings.Builder
	switch {
	case lsOut.Stop() != omni.StatusCompleted:
		fmt.Fprintf(&answer, "I couldn't list the workspace: %s", firstLine(lsOut.Output))
	case len(entries) == 0:
		answer.WriteString("The workspace is empty.")
	default:
		fmt.Fprintf(&answer, "The workspace has %d %s: %s.", len(entries), plural(len(entries), "entry", "entries"), listNames(entries))
	}
	if read {
		answer.WriteString("\n")
		answer.WriteString(describeRead(readCall, readOut))
	}
	answer.WriteString("\n\n" + demoHint)
	return demoEntry(demoStep(stepText, answer.String()))
}

// offered reports whether the request offers the tool: a model only calls
// tools it was given (a compaction request, for one, offers none).
func offered(req *model.Request, tool string) bool {
	for _, t := range req.Tools {
		if t.Name == tool {
			return true
		}
	}
	return false
}

func demoEntry(steps ...step) *entry {
	return &entry{path: "demo", steps: steps, stopReason: omni.StatusCompleted}
}

// demoStep is a text or thinking step in a few visible chunks.
func demoStep(kind stepKind, content string) step {
	return step{kind: kind, content: content, chunks: demoChunks(content), delay: demoDelay}
}

func demoCall(name, args string) step {
	return step{kind: stepToolCall, calls: []call{{name: name, args: args, chunks: 2, delay: demoDelay}}}
}

// demoChunks splits content into fragments of about 24 code points, at most
// demoMaxChunks of them.
func demoChunks(content string) int {
	return min(max((utf8.RuneCountInString(content)+23)/24, 1), demoMaxChunks)
}

func demoThinking(prompt string) string {
	prompt = strings.Join(strings.Fields(prompt), " ")
	if prompt == "" {
		return "There is no question yet; I'll look at the workspace."
	}
	return fmt.Sprintf("The user asked: %s; I'll look at the workspace.", quoteShortN(prompt, 80))
}

// describeRead says what the read_file call found.
func describeRead(c, out omni.Payload) string {
	var args struct {
		FilePath string `json:"file_path"`
	}
	_ = json.Unmarshal([]byte(c.Arguments), &args) // the demo wrote them; a bad value just reads as ""
	name := args.FilePath
	switch {
	case out.Stop() != omni.StatusCompleted:
		return fmt.Sprintf("I couldn't read %s: %s", name, firstLine(out.Output))
	case strings.HasPrefix(out.Output, "[empty file]"):
		return name + " is empty."
	}
	for _, line := range strings.Split(out.Output, "\n") {
		// read_file numbers lines like cat -n: "     1\t…".
		if tab := strings.IndexByte(line, '\t'); tab >= 0 && strings.TrimSpace(line[:tab]) != "" &&
			strings.Trim(strings.TrimSpace(line[:tab]), "0123456789") == "" {
			line = line[tab+1:]
		}
		if line = strings.TrimSpace(line); line != "" {
			return fmt.Sprintf("%s starts with: %s", name, quoteShortN(line, 120))
		}
	}
	return name + " has no text in its first lines."
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if s == "" {
		return "no output"
	}
	return quoteShortN(s, 120)
}

func quoteShortN(s string, n int) string {
	if r := []rune(s); len(r) > n {
		s = string(r[:n]) + "…"
	}
	return `"` + s + `"`
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// lsEntry is one entry of an ls -la listing.
type lsEntry struct {
	name string
	mode byte // first character of the mode: '-' regular file, 'd' directory, 'l' link…
}

// listNames lists entry names, directories with a trailing slash.
func listNames(entries []lsEntry) string {
	const shown = 12
	var names []string
	for i, e := range entries {
		if i == shown {
			names = append(names, fmt.Sprintf("and %d more", len(entries)-shown))
			break
		}
		if e.mode == 'd' {
			names = append(names, e.name+"/")
		} else {
			names = append(names, e.name)
		}
	}
	return strings.Join(names, ", ")
}

// pickFile returns the first README* regular file, else the first
// non-hidden regular file, else "".
func pickFile(entries []lsEntry) string {
	first := ""
	for _, e := range entries {
		if e.mode != '-' || strings.HasPrefix(e.name, ".") {
			continue
		}
		if strings.HasPrefix(strings.ToLower(e.name), "readme") {
			return e.name
		}
		if first == "" {
			first = e.name
		}
	}
	return first
}

// parseListing reads the entries of an ls -la listing, without "." and "..".
// Lines that are not entries (the total, notes) are skipped.
func parseListing(out string) []lsEntry {
	var entries []lsEntry
	for _, line := range strings.Split(out, "\n") {
		if e, ok := parseListingLine(strings.TrimRight(line, "\r")); ok && e.name != "." && e.name != ".." {
			entries = append(entries, e)
		}
	}
	return entries
}

// parseListingLine reads one ls -l line: mode, links, owner, group, size
// (or "major, minor"), a date of three fields ("Nov 29 20:10"), two
// (long-iso) or three (full-iso), then the name, spaces included.
func parseListingLine(line string) (lsEntry, bool) {
	type span struct{ start, end int }
	var f []span
	for i := 0; i < len(line) && len(f) < 12; {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		start := i
		for i < len(line) && line[i] != ' ' && line[i] != '\t' {
			i++
		}
		if i > start {
			f = append(f, span{start, i})
		}
	}
	field := func(i int) string {
		if i >= len(f) {
			return ""
		}
		return line[f[i].start:f[i].end]
	}
	mode := field(0)
	if len(mode) < 10 || !strings.ContainsRune("-dlbcps", rune(mode[0])) || strings.Trim(mode[1:10], "rwxsStT-") != "" {
		return lsEntry{}, false
	}
	at := 5 // first date field
	if strings.HasSuffix(field(4), ",") {
		at++ // device: "major, minor"
	}
	date := field(at)
	switch {
	case len(date) == 10 && date[4] == '-' && date[7] == '-':
		at += 2 // long-iso: 2026-11-29 20:10
		if z := field(at); len(z) == 5 && (z[0] == '+' || z[0] == '-') {
			at++ // full-iso: … 20:10:22.000000000 +0000
		}
	default:
		at += 3 // Nov 29 20:10, or Nov 29  2025
	}
	if at >= len(f) {
		return lsEntry{}, false
	}
	name := line[f[at].start:]
	if mode[0] == 'l' {
		if i := strings.Index(name, " -> "); i >= 0 {
			name = name[:i]
		}
	}
	return lsEntry{name: name, mode: mode[0]}, true
}

// demoTitleWords is how many words of the user's first line the demo
// model makes a title of.
const demoTitleWords = 5

// demoTitle is the demo model's answer to a title request: the first
// words of the first non-blank line of the user's text, capitalized,
// without final punctuation; "" for a text with no words.
func demoTitle(user string) string {
	var words []string
	for l := range strings.Lines(user) {
		if words = strings.Fields(l); len(words) > 0 {
			break
		}
	}
	if len(words) > demoTitleWords {
		words = words[:demoTitleWords]
	}
	t := strings.TrimRight(strings.Join(words, " "), ".,;:!?…")
	r, n := utf8.DecodeRuneInString(t)
	if n == 0 {
		return ""
	}
	return string(unicode.ToUpper(r)) + t[n:]
}
