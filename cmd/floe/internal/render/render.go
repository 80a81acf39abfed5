// Package render draws a Session's stream in a terminal: thinking, text,
// tool calls with their arguments, approval decisions and tool output, live
// as the partials arrive. Colour only on a TTY.
package render

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"floe.dev/pkg/omni"
)

// Renderer writes one Session's stream. Not safe for concurrent use.
type Renderer struct {
	w     io.Writer
	color bool
	// SkipUser is how many user texts to skip: the caller's own Prompt.
	SkipUser int

	streamed map[string]bool // segments rendered from partials
	openKey  string          // segment whose text is mid-line
	outputID string          // tool whose output was printed last
	atBOL    bool
}

// New returns a Renderer writing to w.
func New(w io.Writer, color bool) *Renderer {
	return &Renderer{w: w, color: color, streamed: make(map[string]bool), atBOL: true}
}

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

func prefix(m *omni.Message) string {
	if len(m.Origin) == 0 {
		return ""
	}
	return "[" + m.Origin[len(m.Origin)-1] + "] "
}

// Message renders one OmniMessage.
func (r *Renderer) Message(m *omni.Message) {
	p := &m.Payload
	pre := prefix(m)
	switch {
	case m.IsPartial():
		r.partial(m, pre)
	case m.Type == omni.KindModel:
		k := key(m)
		if r.streamed[k] {
			delete(r.streamed, k)
			if p.Type == omni.TypeToolCallOutput && p.Stop() != omni.StatusCompleted {
				r.line(pre + r.paint(red, "  └ "+p.StopReason))
			}
			return
		}
		switch p.Type {
		case omni.TypeText:
			if p.Role == omni.RoleUser {
				if r.SkipUser > 0 && len(m.Origin) == 0 {
					r.SkipUser--
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
			r.line(pre + r.paint(dim, p.Thinking))
		case omni.TypeToolCall:
			r.line(pre + r.paint(cyan, "→ "+p.Name+" "+compact(p.Arguments)))
		case omni.TypeToolCallOutput:
			r.line(pre + "  " + strings.ReplaceAll(strings.TrimRight(p.Output, "\n"), "\n", "\n  "))
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
		if r.outputID != k || r.openKey != k {
			r.newline()
			r.write(pre + r.paint(dim, "  ┌ output "+p.ToolCallID) + "\n")
			r.outputID = k
		}
		r.openKey = k
		if content != "" {
			r.write(indent(content, r.atBOL))
		}
		if p.EventType == omni.EventStop {
			r.newline()
		}
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

func indent(s string, atBOL bool) string {
	var b strings.Builder
	for i, line := range strings.SplitAfter(s, "\n") {
		if line == "" {
			continue
		}
		if i > 0 || atBOL {
			b.WriteString("  │ ")
		}
		b.WriteString(line)
	}
	return b.String()
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
		if p.Status != omni.StatusCompleted {
			msg := fmt.Sprintf("! request %s (attempt %d): %s", p.Status, p.Attempt, p.ErrorMessage)
			if p.RetryInMs > 0 {
				msg += fmt.Sprintf("; retrying in %.1fs", float64(p.RetryInMs)/1000)
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
	r.line(r.paint(yellow, fmt.Sprintf("? approve %s %s (%s)", tc.Payload.Name, compact(tc.Payload.Arguments), tc.Payload.ToolCallID)))
}

// Flush ends any open line.
func (r *Renderer) Flush() { r.newline() }

func compact(args string) string {
	var v any
	if json.Unmarshal([]byte(args), &v) != nil {
		return args
	}
	b, _ := json.Marshal(v)
	return string(b)
}
