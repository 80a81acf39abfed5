package reexec

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/omni"
)

// Hooks replay (protocol.md §7 "Hooks"): every hook the record shows
// becomes a NATS hook of the replay's engine, answered here from the
// record; no hook command runs. A pre_tool_use hook answers what its
// record says for its tool call (a call it left no record for: no
// opinion); a stop hook answers from the group of stop records at the
// replay's position (the engine runs a stop point's hooks before it
// publishes their records, so every hook of one point sees the same
// position), with the continue input the record shows after the group;
// user_prompt hooks, which leave no record, answer the harness context
// texts before a Prompt, and the refusal of a refused one.

// hookHeader names the hook of a NATS hook request (the engine's
// hooks.HeaderName).
const hookHeader = "Floe-Hook-Name"

// A stopGroup is the stop hook records of one stop point.
type stopGroup struct {
	at    int // the index of its first record
	recs  []omni.HookRecord
	input string // the continue input that followed, if any
}

// A refusalRec is a Prompt refused by a user_prompt hook.
type refusalRec struct {
	name, reason string
}

// refusedPrompt is the input the replay sends for a refused Prompt (the
// record keeps only the refusal; the hook answers it the same way).
const refusedPrompt = "[a prompt refused by a hook]"

// parseRefusal reads "[prompt refused by the <name> hook: <reason>]".
func parseRefusal(m *omni.Message) (refusalRec, bool) {
	p := &m.Payload
	if m.Type != omni.KindModel || p.Role != omni.RoleAssistant || p.Type != omni.TypeText || p.Stop() != omni.StatusFailed {
		return refusalRec{}, false
	}
	body, ok := strings.CutPrefix(p.Text, "[prompt refused by the ")
	if !ok || !strings.HasSuffix(body, "]") {
		return refusalRec{}, false
	}
	body = strings.TrimSuffix(body, "]")
	if name, reason, ok := strings.Cut(body, " hook: "); ok {
		return refusalRec{name: name, reason: reason}, true
	}
	if name, ok := strings.CutSuffix(body, " hook"); ok {
		return refusalRec{name: name}, true
	}
	return refusalRec{}, false
}

// hookOf returns the hook record of records[i] when it is one of the
// Session's own (not a child's).
func hookOf(records []omni.Message, i int) (omni.HookRecord, bool) {
	m := &records[i]
	if m.Type != omni.KindEvent || len(m.Origin) > 0 {
		return omni.HookRecord{}, false
	}
	return m.Payload.Hook()
}

// A preHook is a pre_tool_use hook's record and its index.
type preHook struct {
	rec omni.HookRecord
	at  int // the index of its call's first hook record
}

// A hookPlayer answers the replay's hook requests from the record.
type hookPlayer struct {
	tasks []task
	pre   map[[2]string]preHook // by (tool_call_id, name)
	pc    *pacer
	sid   string
}

// hooksConfig is the hooks file of the replay's engine: a NATS hook per
// name the record shows, per point, in the order they first appear
// (the order the records of one point come in); user_prompt hooks for
// the refusals and as many context hooks as a Prompt had contexts.
// ok is false when the record shows no hooks.
func hooksConfig(records []omni.Message, tasks []task) (cfg []byte, ok bool) {
	names := map[string][]string{}
	add := func(point, name string) {
		if !slices.Contains(names[point], name) {
			names[point] = append(names[point], name)
		}
	}
	for i := range records {
		if r, ok := hookOf(records, i); ok && (r.Point == omni.HookPreToolUse || r.Point == omni.HookStop) {
			add(r.Point, r.Name)
		}
	}
	contexts := 0
	for _, t := range tasks {
		if t.refusal != nil {
			add(omni.HookUserPrompt, t.refusal.name)
		}
		contexts = max(contexts, len(t.contexts))
	}
	for i := range contexts {
		add(omni.HookUserPrompt, contextHook(i))
	}
	if len(names) == 0 {
		return nil, false
	}
	type hook struct {
		Name string `json:"name"`
		NATS bool   `json:"nats"`
	}
	file := map[string]map[string][]hook{"hooks": {}}
	for point, ns := range names {
		for _, n := range ns {
			file["hooks"][point] = append(file["hooks"][point], hook{Name: n, NATS: true})
		}
	}
	b, err := json.Marshal(file)
	if err != nil {
		return nil, false
	}
	return b, true
}

func contextHook(i int) string { return fmt.Sprintf("replay-context-%d", i+1) }

// writeHooks writes the replay's hooks file under home ("" when the
// record shows no hooks).
func writeHooks(home string, records []omni.Message, tasks []task) (string, error) {
	b, ok := hooksConfig(records, tasks)
	if !ok {
		return "", nil
	}
	path := filepath.Join(home, "hooks.json")
	return path, os.WriteFile(path, b, 0o600)
}

func newHookPlayer(records []omni.Message, tasks []task, pc *pacer) *hookPlayer {
	hp := &hookPlayer{tasks: tasks, pre: map[[2]string]preHook{}, pc: pc}
	for i := range records {
		if r, ok := hookOf(records, i); ok && r.Point == omni.HookPreToolUse {
			// A call's hooks run one after the other and their records
			// are published after the last: each waits for the first.
			at := i
			for at > 0 {
				if p, ok := hookOf(records, at-1); !ok || p.Point != omni.HookPreToolUse || p.ToolCallID != r.ToolCallID {
					break
				}
				at--
			}
			hp.pre[[2]string{r.ToolCallID, r.Name}] = preHook{r, at}
		}
	}
	return hp
}

// serve answers the hook requests of the replay on nc until the returned
// func is called.
func (hp *hookPlayer) serve(ctx context.Context, nc *nats.Conn, sid string) (func(), error) {
	hp.sid = sid
	var subs []*nats.Subscription
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for _, point := range []string{omni.HookUserPrompt, omni.HookPreToolUse, omni.HookStop} {
		s, err := nc.Subscribe(omni.HookSubject(point), func(m *nats.Msg) {
			// Answered in its own goroutine: a stop hook waits for the
			// replay's position.
			go func() { _ = m.Respond(hp.answer(ctx, point, m.Header.Get(hookHeader), m.Data)) }()
		})
		if err != nil {
			stop()
			return nil, err
		}
		subs = append(subs, s)
	}
	return stop, nil
}

// hookIn is the part of a hook's input the replay reads.
type hookIn struct {
	SessionID  string `json:"session_id"`
	TaskID     string `json:"task_id"`
	Prompt     string `json:"prompt"`
	ToolCallID string `json:"tool_call_id"`
}

// answer is the recorded answer of hook name at point (nil: no opinion).
func (hp *hookPlayer) answer(ctx context.Context, point, name string, body []byte) []byte {
	var in hookIn
	if json.Unmarshal(body, &in) != nil || in.SessionID != hp.sid {
		return nil
	}
	switch point {
	case omni.HookPreToolUse:
		if h, ok := hp.pre[[2]string{in.ToolCallID, name}]; ok {
			// Answered when the replay reaches the record's position:
			// the engine holds the model stream while a call's hooks
			// run, so what else lands meanwhile (another call's
			// output, an approval) lands as it did.
			if hp.pc.wait(ctx, hp.sid, h.at) != nil {
				return nil
			}
			return answerOf(h.rec, "")
		}
	case omni.HookStop:
		t := hp.task(in.TaskID)
		if t == nil || len(t.stops) == 0 {
			return nil
		}
		// The first group at or after the replay's position: wait
		// until the replay reaches it. A stop point that left no record
		// never does (the Task waits for this answer): no opinion.
		have := hp.pc.count(hp.sid)
		i := slices.IndexFunc(t.stops, func(g stopGroup) bool { return g.at >= have })
		if i < 0 {
			return nil
		}
		g := &t.stops[i]
		if hp.pc.wait(ctx, hp.sid, g.at) != nil {
			return nil
		}
		have = hp.pc.count(hp.sid)
		if have != g.at {
			return nil
		}
		for _, r := range g.recs {
			if r.Name == name {
				input := ""
				if r.Decision == omni.DecisionContinue {
					input = g.input
				}
				return answerOf(r, input)
			}
		}
	case omni.HookUserPrompt:
		t := hp.task(in.TaskID)
		if t == nil || in.Prompt != t.promptText() {
			return nil // steering: not replayed
		}
		if t.refusal != nil && t.refusal.name == name {
			return answerOf(omni.HookRecord{Decision: omni.DecisionDeny, Reason: t.refusal.reason}, "")
		}
		for i, c := range t.contexts {
			if contextHook(i) == name {
				b, _ := json.Marshal(map[string]string{"context": c})
				return b
			}
		}
	}
	return nil
}

// task is the planned Task of a replay Task id ("replay-N").
func (hp *hookPlayer) task(id string) *task {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "replay-"))
	if err != nil || n < 1 || n > len(hp.tasks) {
		return nil
	}
	return &hp.tasks[n-1]
}

// answerOf is the answer that makes the engine write r again.
func answerOf(r omni.HookRecord, input string) []byte {
	a := map[string]any{}
	if r.Decision != "" {
		a["decision"] = r.Decision
	}
	if r.Reason != "" {
		a["reason"] = r.Reason
	}
	if r.Output != nil {
		a["output"] = r.Output
	}
	if input != "" {
		a["input"] = input
	}
	b, err := json.Marshal(a)
	if err != nil {
		return nil
	}
	return b
}

// promptText is the text the user_prompt hooks see for the Task's input.
func (t *task) promptText() string {
	var texts []string
	for _, in := range t.input {
		if in.Type != "image_url" {
			texts = append(texts, in.Text)
		}
	}
	return strings.Join(texts, "\n")
}
