package render

import (
	"fmt"
	"strings"
	"time"

	"floe.dev/pkg/omni"
)

// taskTally follows the Task being rendered, from the messages alone (so
// a live run and its history close it with the same line): when its
// Prompt was written, the last message's time, its requests and tokens,
// and how it ended.
type taskTally struct {
	open     bool
	start    time.Time
	last     time.Time
	requests int
	usage    omni.Usage // the sum of its requests' usage
	status   string     // the last request's status, or aborted
}

// tally notes a root message: a Prompt opens a Task (closing the one
// before it, as history shows one Task after another).
func (r *Renderer) tally(m *omni.Message) {
	p := &m.Payload
	at, _ := time.Parse(omni.TimeLayout, m.Timestamp)
	if m.Type == omni.KindModel && p.Type == omni.TypeText && p.Role == omni.RoleUser && !m.IsPartial() && !isSystemBlock(p.Text) && p.Sender != omni.SenderHarness {
		if r.task.open {
			r.TaskEnd("")
		}
		r.task = taskTally{open: true, start: at, last: at}
		return
	}
	if !r.task.open {
		return
	}
	if !at.IsZero() {
		r.task.last = at
	}
	if m.Type != omni.KindEvent {
		return
	}
	switch p.Type {
	case omni.TypeRequestEnd:
		r.task.requests++
		r.task.status = p.Status
	case omni.TypeTokenUsage:
		if p.Request != nil {
			r.task.usage = r.task.usage.Add(*p.Request)
		}
	case omni.TypeAbort:
		r.task.status = omni.StatusAborted
	}
}

func isSystemBlock(s string) bool {
	for _, tag := range []string{omni.TagTurnRetried, omni.TagTurnAborted, omni.TagUserSteering, omni.TagSummary, omni.TagContextSummary} {
		if strings.HasPrefix(s, "["+tag+"]") {
			return true
		}
	}
	return false
}

// TaskEnd closes the Task being rendered with one line: how it ended,
// how long it took (its Prompt to its last message), its model requests
// and tokens. status is the Task's state from the server ("" to take it
// from the messages). Nothing when no Task is open.
func (r *Renderer) TaskEnd(status string) {
	t := r.task
	r.task = taskTally{}
	if !t.open {
		return
	}
	if status == "" {
		status = t.status
	}
	if status == "" {
		status = omni.StatusCompleted
	}
	r.line(r.paint(dim, TaskLine(status, t.last.Sub(t.start), t.requests, t.usage)))
}

// TaskLine is the closing line of a Task, e.g.
// "── completed · 3.2 s · 2 requests · 1,234 tokens (56 out)".
func TaskLine(status string, took time.Duration, requests int, u omni.Usage) string {
	parts := []string{"── " + status, duration(took)}
	if requests > 0 {
		parts = append(parts, plural(requests, "request"))
	}
	if u.Total > 0 || u.Output > 0 {
		parts = append(parts, fmt.Sprintf("%s tokens (%s out)", thousands(u.Total), thousands(u.Output)))
	}
	return strings.Join(parts, " · ")
}

func duration(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
	case d >= time.Minute:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// thousands writes n with comma separators.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}
