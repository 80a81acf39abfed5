// Package render draws a Session's stream in a terminal: thinking, text,
// tool calls with their arguments, approval decisions and tool output, live
// as the partials arrive. Colour only on a TTY.
package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"

	"floe.dev/pkg/omni"
)

// Renderer writes one Session's stream. Not safe for concurrent use.
type Renderer struct {
	w     io.Writer
	color bool
	// SkipUser is how many user texts to skip: the caller's own Prompt.
	SkipUser int
	// MaxAttempts is how many attempts a model request gets (retries + 1),
	// shown with each retry; 0 when unknown.
	MaxAttempts int
	// Full shows tool output whole instead of folding long output to its
	// first and last lines.
	Full bool
	// LastError is the cause of the last failed model request, for the
	// caller's final message ("" after a request that succeeded).
	LastError string

	streamed map[string]bool    // segments rendered from partials
	deferred map[string]bool    // tool calls rendered whole at the end (diffs)
	folds    map[string]*folder // streamed tool outputs
	openKey  string             // segment whose text is mid-line
	outputID string             // tool whose output was printed last
	atBOL    bool
	task     taskTally // the Task being rendered, for its closing line
}

// New returns a Renderer writing to w.
func New(w io.Writer, color bool) *Renderer {
	return &Renderer{w: w, color: color, streamed: make(map[string]bool),
		deferred: make(map[string]bool), folds: make(map[string]*folder), atBOL: true}
}

// Folding of long tool output: the first foldHead and last foldTail lines
// of an output longer than foldHead+foldTail+foldSlack lines are shown.
const (
	foldHead  = 10
	foldTail  = 5
	foldSlack = 3
)

const (
	dim    = "\x1b[2m"
	bold   = "\x1b[1m"
	cyan   = "\x1b[36m"
	green  = "\x1b[32m"
	red    = "\x1b[31m"
	yellow = "\x1b[33m"
	reset  = "\x1b[0m"
)

func (r *Renderer) paint(style, s string) string {
	if !r.color || s == "" {
		return s
	}
	return style + s + reset
}

func (r *Renderer) write(s string) {
	if s == "" {
		return
	}
	io.WriteString(r.w, s)
	r.atBOL = strings.HasSuffix(s, "\n")
}

func (r *Renderer) newline() {
	if !r.atBOL {
		r.write("\n")
	}
	r.openKey = ""
}

func (r *Renderer) line(s string) {
	r.newline()
	r.write(s + "\n")
}

func key(m *omni.Message) string {
	t := m.Payload.Type
	if c := omni.CompleteType(t); c != "" {
		t = c
	}
	return strings.Join(m.Origin, "/") + "|" + t + "|" + m.Payload.ToolCallID
}

// prefix indents a subagent's messages by their depth and names the
// subagent.
func prefix(m *omni.Message) string { return prefixOf(m.Origin) }

func prefixOf(origin []string) string {
	if len(origin) == 0 {
		return ""
	}
	return strings.Repeat("  ", len(origin)) + "[" + origin[len(origin)-1] + "] "
}

// Message renders one OmniMessage.
func (r *Renderer) Message(m *omni.Message) {
	p := &m.Payload
	pre := prefix(m)
	if len(m.Origin) == 0 {
		r.tally(m)
	}
	switch {
	case m.IsPartial():
		r.partial(m, pre)
	case m.Type == omni.KindModel:
		k := key(m)
		if r.streamed[k] {
			delete(r.streamed, k)
			if r.deferred[k] {
				delete(r.deferred, k)
				r.toolCall(pre, p)
			}
			if p.Type == omni.TypeToolCallOutput {
				if f := r.folds[k]; f != nil {
					delete(r.folds, k)
					r.finishFold(pre, f)
				}
				if p.Stop() != omni.StatusCompleted {
					r.line(pre + r.paint(red, "  └ "+p.StopReason))
				}
			}
			return
		}
		switch p.Type {
		case omni.TypeText:
			if p.Role == omni.RoleUser {
				// A text the harness wrote (a hook's context, a stop
				// hook's continue input) is not the caller's Prompt.
				if p.Sender == omni.SenderHarness {
					r.line(pre + r.paint(dim, "> "+p.Text+"  (harness)"))
					return
				}
				if r.SkipUser > 0 && len(m.Origin) == 0 {
					r.SkipUser--
					return
				}
				if t, ok := unblock(omni.TagUserSteering, p.Text); ok {
					r.line(pre + r.paint(bold, "> "+t) + r.paint(dim, "  (steering)"))
					return
				}
				r.line(pre + r.paint(bold, "> "+p.Text))
				return
			}
			style := ""
			if p.StopReason == omni.StatusFailed {
				style = yellow
			}
			r.line(pre + r.paint(style, p.Text))
		case omni.TypeThinking:
			r.line(pre + r.paint(dim, "thinking: "+p.Thinking))
		case omni.TypeToolCall:
			r.toolCall(pre, p)
		case omni.TypeToolCallOutput:
			// As a streamed output is drawn: a header, the lines behind a
			// bar, folded alike, and how it ended when not completed.
			r.newline()
			r.write(pre + r.paint(dim, "  ┌ output "+p.ToolCallID) + "\n")
			r.outputID = k
			lines := splitLines(p.Output)
			if n := len(lines); !r.Full && n > foldHead+foldTail+foldSlack {
				hidden := r.paint(dim, fmt.Sprintf("… %d more lines (%d in all) …", n-foldHead-foldTail, n))
				lines = append(append(lines[:foldHead:foldHead], hidden), lines[n-foldTail:]...)
			}
			for _, l := range lines {
				r.write(pre + "  │ " + l + "\n")
			}
			if p.Stop() != omni.StatusCompleted {
				r.line(pre + r.paint(red, "  └ "+p.StopReason))
			}
		}
	case m.Type == omni.KindEvent:
		r.event(m, pre)
	}
}

func (r *Renderer) partial(m *omni.Message, pre string) {
	p := &m.Payload
	k := key(m)
	content := p.Content()
	if p.EventType == omni.EventStart {
		r.streamed[k] = true
	}
	switch p.Type {
	case omni.TypePartialToolCallOutput:
		f := r.folds[k]
		if f == nil {
			f = &folder{}
			r.folds[k] = f
		}
		if r.outputID != k || r.openKey != k {
			r.newline()
			r.write(pre + r.paint(dim, "  ┌ output "+p.ToolCallID) + "\n")
			r.outputID = k
		}
		r.openKey = k
		r.foldWrite(pre, f, content)
		if p.EventType == omni.EventStop {
			r.newline()
		}
		return
	case omni.TypePartialToolCall:
		// A call is shown whole when complete, as history shows it (its
		// arguments compacted, a diff for file edits).
		r.deferred[k] = true
		return
	}
	if r.openKey != k {
		r.newline()
		r.openKey = k
		switch p.Type {
		case omni.TypePartialThinking:
			r.write(pre + r.paint(dim, "thinking: "))
		case omni.TypePartialToolCall:
			r.write(pre + r.paint(cyan, "→ "+p.Name+" "))
		default:
			r.write(pre)
		}
	}
	switch p.Type {
	case omni.TypePartialThinking:
		r.write(r.paint(dim, content))
	case omni.TypePartialToolCall:
		r.write(r.paint(cyan, content))
	default:
		r.write(content)
	}
	if p.EventType == omni.EventStop {
		r.newline()
	}
}

func (r *Renderer) event(m *omni.Message, pre string) {
	p := &m.Payload
	switch p.Type {
	case omni.TypeApprovalDecision:
		mark := r.paint(green, "✓ allowed")
		if p.Decision != omni.DecisionAllow {
			mark = r.paint(red, "✗ "+p.Decision)
		}
		r.line(pre + "  " + mark + " " + r.paint(dim, p.ToolCallID))
	case omni.TypeRequestEnd:
		switch p.Status {
		case omni.StatusCompleted:
			r.LastError = ""
		case omni.StatusAborted:
		default:
			r.LastError = Cause(p.ErrorMessage)
			if r.LastError == "" {
				r.LastError = p.Status
			}
			msg := "model request failed: " + r.LastError
			if p.RetryInMs > 0 {
				msg += "; retrying in " + seconds(p.RetryInMs)
				if r.MaxAttempts > 0 {
					msg += fmt.Sprintf(" (attempt %d of %d)", p.Attempt+1, r.MaxAttempts)
				} else {
					msg += fmt.Sprintf(" (attempt %d)", p.Attempt+1)
				}
			} else if p.Attempt > 1 {
				msg += fmt.Sprintf("; giving up after %d attempts", p.Attempt)
			}
			r.line(pre + r.paint(yellow, msg))
		}
	case omni.TypeAbort:
		r.line(pre + r.paint(red, "■ aborted"))
	case omni.TypeCompactionBegin:
		r.line(pre + r.paint(dim, fmt.Sprintf("… compacting (%s, %s)", p.Reason, p.Mode)))
	case omni.TypeCompactionEnd:
		r.line(pre + r.paint(dim, "… compaction "+p.Status))
	case omni.TypeSubagent:
		r.line(pre + r.paint(dim, "… subagent "+p.SessionID))
	case omni.TypeHook:
		// Which hook decided what, and why (a denied call's own output
		// names the hook too).
		h, _ := p.Hook()
		col := dim
		switch h.Decision {
		case omni.DecisionDeny:
			col = red
		case omni.DecisionContinue:
			col = yellow
		}
		msg := "⚑ " + h.Point + " hook " + h.Name
		if h.Decision != "" {
			msg += ": " + h.Decision
		}
		if h.Reason != "" {
			msg += " — " + h.Reason
		}
		if h.ToolCallID != "" {
			msg += " " + r.paint(dim, h.ToolCallID)
		}
		r.line(pre + "  " + r.paint(col, msg))
	case omni.TypeMCPConnectEnd:
		// Only failures: they say why a server's tools are missing.
		var results []omni.MCPConnectResult
		_ = json.Unmarshal(p.Field("results"), &results)
		for _, res := range results {
			if res.Status != omni.StatusCompleted {
				r.line(pre + r.paint(yellow, fmt.Sprintf("MCP server %s not connected (its tools are unavailable): %s", res.Server, res.Error)))
			}
		}
	}
}

// Server renders a server event (approval requests; task state is the
// caller's business).
func (r *Renderer) Server(ev *omni.ServerEvent) {
	if ev.Type != omni.ServerApprovalRequest {
		return
	}
	var tc omni.Message
	if err := omni.Unmarshal(ev.ToolCall, &tc); err != nil {
		return
	}
	what := compact(tc.Payload.Arguments)
	if _, path, ok := diffLines(tc.Payload.Name, tc.Payload.Arguments); ok {
		what = path // its diff is on screen already
	}
	r.line(prefixOf(ev.Origin) + r.paint(yellow, fmt.Sprintf("? approve %s %s (%s)", tc.Payload.Name, what, tc.Payload.ToolCallID)))
}

// Flush ends any open line.
func (r *Renderer) Flush() { r.newline() }

// compact is a call's arguments on one line, keys in the model's order.
func compact(args string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(args)) != nil {
		return args
	}
	return b.String()
}

// toolCall renders a complete tool call: a short diff for file edits, else
// the name and compact arguments.
func (r *Renderer) toolCall(pre string, p *omni.Payload) {
	head := pre + r.paint(cyan, "→ "+p.Name+" ")
	if lines, path, ok := diffLines(p.Name, p.Arguments); ok {
		r.line(head + r.paint(cyan, path))
		for _, l := range lines {
			style := dim
			switch {
			case strings.HasPrefix(l, "- "):
				style = red
			case strings.HasPrefix(l, "+ "):
				style = green
			}
			r.line(pre + "  " + r.paint(style, l))
		}
		return
	}
	r.line(head + r.paint(cyan, compact(p.Arguments)))
}

func diffTool(name string) bool { return name == "edit_file" || name == "write_file" }

// diffMax is how many removed and added lines a diff shows.
const diffMax = 8

// diffLines is the short diff of an edit_file or write_file call: the
// changed lines (common leading and trailing lines dropped), at most
// diffMax of each side.
func diffLines(name, args string) (lines []string, path string, ok bool) {
	if !diffTool(name) {
		return nil, "", false
	}
	var a struct {
		FilePath   string  `json:"file_path"`
		OldString  *string `json:"old_string"`
		NewString  *string `json:"new_string"`
		Content    *string `json:"content"`
		ReplaceAll bool    `json:"replace_all"`
	}
	if json.Unmarshal([]byte(args), &a) != nil || a.FilePath == "" {
		return nil, "", false
	}
	side := func(mark string, ls []string) {
		for i, l := range ls {
			if i == diffMax {
				lines = append(lines, fmt.Sprintf("… %d more lines", len(ls)-diffMax))
				break
			}
			lines = append(lines, mark+l)
		}
	}
	switch {
	case name == "write_file" && a.Content != nil:
		ls := splitLines(*a.Content)
		path = fmt.Sprintf("%s (%d lines)", a.FilePath, len(ls))
		side("+ ", ls)
	case name == "edit_file" && a.OldString != nil && a.NewString != nil:
		old, nw := splitLines(*a.OldString), splitLines(*a.NewString)
		for len(old) > 0 && len(nw) > 0 && old[0] == nw[0] {
			old, nw = old[1:], nw[1:]
		}
		for len(old) > 0 && len(nw) > 0 && old[len(old)-1] == nw[len(nw)-1] {
			old, nw = old[:len(old)-1], nw[:len(nw)-1]
		}
		path = a.FilePath
		if a.ReplaceAll {
			path += " (every occurrence)"
		}
		side("- ", old)
		side("+ ", nw)
	default:
		return nil, "", false
	}
	return lines, path, true
}

func splitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// folder folds one streamed tool output: the first foldHead lines are
// written live, later ones kept in a ring of the last foldTail+foldSlack.
type folder struct {
	lines  int      // complete lines seen
	mid    bool     // the output is mid-line
	cur    string   // the current line while folding
	ring   []string // the last lines past the head
	hidden int      // lines dropped from the ring
}

func (r *Renderer) foldWrite(pre string, f *folder, content string) {
	for content != "" {
		line, rest, nl := strings.Cut(content, "\n")
		content = rest
		if r.Full || f.lines < foldHead {
			if r.atBOL {
				r.write(pre + "  │ ")
			}
			if nl {
				r.write(line + "\n")
				f.lines++
				f.mid = false
			} else {
				r.write(line)
				f.mid = line != "" || f.mid
			}
			continue
		}
		f.cur += line
		if !nl {
			f.mid = true
			continue
		}
		f.lines++
		f.mid = false
		f.ring = append(f.ring, f.cur)
		f.cur = ""
		if len(f.ring) > foldTail+foldSlack {
			f.ring = f.ring[1:]
			f.hidden++
		}
	}
}

// finishFold writes what the folder held back when the output ends.
func (r *Renderer) finishFold(pre string, f *folder) {
	if f.cur != "" {
		f.ring = append(f.ring, f.cur)
		f.cur = ""
	}
	if len(f.ring) == 0 {
		return
	}
	r.newline()
	tail := f.ring
	if f.hidden > 0 {
		drop := len(tail) - foldTail
		tail = tail[drop:]
		r.write(pre + "  │ " + r.paint(dim, fmt.Sprintf("… %d more lines (%d in all) …", f.hidden+drop, f.lines+boolInt(f.mid))) + "\n")
	}
	for _, l := range tail {
		r.write(pre + "  │ " + l + "\n")
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// unblock returns the text inside a [tag]…[/tag] system block.
func unblock(tag, s string) (string, bool) {
	open, end := "["+tag+"]", "[/"+tag+"]"
	if strings.HasPrefix(s, open) && strings.HasSuffix(s, end) && len(s) >= len(open)+len(end) {
		return strings.Trim(s[len(open):len(s)-len(end)], "\n"), true // [tag]\n…\n[/tag] or [tag]…[/tag]
	}
	return "", false
}

func seconds(ms int64) string {
	if ms%1000 == 0 || ms >= 10000 {
		return fmt.Sprintf("%d s", (ms+500)/1000)
	}
	return fmt.Sprintf("%.1f s", float64(ms)/1000)
}

var dialErr = regexp.MustCompile(`dial tcp ([^:\s]+:\d+|\[[^\]]+\]:\d+): (?:connect: )?(.+)$`)

// Cause shortens a provider error for one terminal line: a refused or
// unreachable connection becomes "connection refused (host:port)".
func Cause(msg string) string {
	msg = strings.TrimSpace(msg)
	if m := dialErr.FindStringSubmatch(msg); m != nil {
		return m[2] + " (" + m[1] + ")"
	}
	return msg
}
