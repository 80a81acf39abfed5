// Package reexec re-executes a recorded Session (protocol.md §8, floe replay
// --execute): the recorded Tasks are run again through the current
// engine, on a private embedded bus in a temporary home, with every model
// answer served from the record (the engine's replay provider) and every
// tool output too (a toolrunner in replay mode: nothing runs), and every
// approval answered as it was. The new Trace is then compared with the
// recorded one record for record, timestamps and ids aside.
//
// What replays: Prompts (a Task per group of user inputs), model requests
// and their retries (a failed attempt fails again the same way), tool
// calls and their outputs at their recorded positions, approvals
// (allow, deny; forbidden by the command policy), manual compactions and
// automatic ones (with the Session's compaction settings, or settings
// inferred from the record: InferCompaction), the max-turns
// notice, steering (sent once the replay reaches the request before the
// steering record: the engine takes it before its next request), user
// aborts (sent where the record shows them, the provider or the tool
// stalled there: abortPoint), hooks (NATS hooks answered from the
// record, hooks.go), MCP connect events and tool outputs (the replay
// toolrunner's) and subagents (each child from its own record and
// compared with it, children.go).
package reexec

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

// Options tune a re-execution.
type Options struct {
	// MaxTurns and Compaction are the recorded Session's settings (a Trace
	// does not hold them; $FLOE_HOME's Session record does).
	MaxTurns   int
	Compaction omni.CompactionConfig
	// Engine, when set, changes the engine's configuration before it
	// starts (tests change a rule this way).
	Engine func(*engine.Config)
	// Pace bounds each wait for the replay to reach a record's position
	// (default 3 s): past it the replay goes on, and the difference shows.
	Pace time.Duration
	Log  zerolog.Logger
	// Children are the records of the Session's subagent children (and
	// theirs), by recorded Session id (LoadChildren).
	Children map[string][]omni.Message
}

// Result is a re-execution's new Trace and how it compares.
type Result struct {
	Records []omni.Message // the new Trace, in order
	// Diff is the index of the first record where the two part (-1 when
	// they are equal); the shorter one may simply end there.
	Diff int
	// Children compare each subagent child's new Trace with its record,
	// in the order of the recorded ids.
	Children []ChildResult
}

// A ChildResult is a subagent child's comparison: Records is its new
// Trace (nil when the replay never created it).
type ChildResult struct {
	Recorded string // the recorded child's Session id
	Want     []omni.Message
	Records  []omni.Message
	Diff     int
}

// Equal reports whether the new Trace equals the recorded one, and each
// child's its record.
func (r *Result) Equal() bool {
	for _, c := range r.Children {
		if c.Diff >= 0 {
			return false
		}
	}
	return r.Diff < 0
}

// Run re-executes the Session recorded in records (its Trace files in
// order, as read).
func Run(ctx context.Context, records []omni.Message, opt Options) (*Result, error) {
	if len(records) == 0 || records[0].Type != omni.KindSessionMeta {
		return nil, errors.New("reexec: the record does not start with session_meta")
	}
	if opt.Pace <= 0 {
		opt.Pace = 3 * time.Second
	}
	if opt.Compaction == (omni.CompactionConfig{}) {
		opt.Compaction = InferCompaction(records)
	}
	home, err := os.MkdirTemp("", "floe-reexec-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(home)
	recPath := filepath.Join(home, "record.jsonl")
	var buf []byte
	for i := range records {
		b, err := omni.Marshal(&records[i])
		if err != nil {
			return nil, fmt.Errorf("reexec: record %d: %w", i+1, err)
		}
		buf = append(append(buf, b...), '\n')
	}
	if err := os.WriteFile(recPath, buf, 0o600); err != nil {
		return nil, err
	}
	meta := records[0].Payload
	ws := meta.Workspace
	if fi, err := os.Stat(ws); ws == "" || err != nil || !fi.IsDir() || !filepath.IsAbs(ws) {
		ws = filepath.Join(home, "workspace") // nothing runs in it
		if err := os.MkdirAll(ws, 0o755); err != nil {
			return nil, err
		}
	}

	now := time.Now()
	sid := omni.NewSessionID(now, randHex(4))
	pc := newPacer(opt.Pace)
	kids := newChildRecords(pc, sid, records, opt.Children)
	// The product's ladder (5 reconnects), without its waits: a wait is
	// timing, not behaviour (the comparison ignores retry_in_ms).
	eng := engine.Config{Home: home, RetryBase: time.Millisecond, RetryCap: time.Millisecond, RetryMax: 5}
	eng.Providers.ReplayWait = pc.wait
	eng.Providers.ReplayChildren = kids.of
	if opt.Engine != nil {
		opt.Engine(&eng)
	}
	tasks := plan(records)
	if eng.Hooks.File, err = writeHooks(home, records, tasks); err != nil {
		return nil, err
	}
	tr := tracer.DefaultConfig()
	tr.Home = home
	trc := toolrunner.Config{RunnerID: "replay", Replay: toolrunner.NewReplay(records)}
	trc.Replay.Wait = pc.wait
	trc.Replay.Stalled = pc.stalled
	trc.Replay.Children = kids.of
	st, err := stack.Start(ctx, stack.Options{Home: home, Listen: "off", Engine: &eng, Tracer: &tr, Toolrunner: &trc}, opt.Log)
	if err != nil {
		return nil, fmt.Errorf("reexec: start: %w", err)
	}
	defer st.Stop()

	rec := &omni.SessionRecord{ID: sid, Model: "replay:" + recPath, Workspace: ws, ApprovalMode: omni.ApproveAlwaysAsk,
		SystemPrompt: meta.SystemPrompt, MaxTurns: opt.MaxTurns, Compaction: opt.Compaction,
		State: omni.StateIdle, CreatedUnixMs: now.UnixMilli()}
	if err := st.Sessions.Create(ctx, rec); err != nil {
		return nil, fmt.Errorf("reexec: create session: %w", err)
	}
	fctx, stopFollow := context.WithCancel(ctx)
	pc.start(fctx, st, sid)
	defer func() { stopFollow(); pc.done() }()

	if eng.Hooks.File != "" {
		stopHooks, err := newHookPlayer(records, tasks, pc).serve(ctx, st.Conn, sid)
		if err != nil {
			return nil, fmt.Errorf("reexec: hooks: %w", err)
		}
		defer stopHooks()
	}
	decisions := approvals(records, tasks)
	for i, t := range tasks {
		if err := runTask(ctx, st, sid, fmt.Sprintf("replay-%d", i+1), i, t, decisions, pc, kids); err != nil {
			return nil, err
		}
	}
	got, err := newTrace(ctx, st, home, sid)
	if err != nil {
		return nil, err
	}
	res := &Result{Records: got, Diff: FirstDiff(records, got)}
	replayed := map[string]string{} // recorded child → its replay
	for child, rec := range kids.pairs() {
		replayed[rec] = child
	}
	ids := make([]string, 0, len(opt.Children))
	for id := range opt.Children {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		c := ChildResult{Recorded: id, Want: opt.Children[id]}
		if child, ok := replayed[id]; ok {
			if c.Records, err = newTrace(ctx, st, home, child); err != nil {
				return nil, err
			}
		}
		c.Diff = FirstDiff(c.Want, c.Records)
		res.Children = append(res.Children, c)
	}
	return res, nil
}

// InferCompaction returns compaction settings under which the engine
// compacts automatically where the record did, for a record that comes
// without its Session's settings (a --trace file): each automatic
// compaction_begin carries the context size (the last request's total) or
// the turn count that crossed the threshold, so the smallest of each is a
// threshold every recorded compaction crossed (and, the record being the
// engine's, no earlier check did). The mode is the compactions' own.
func InferCompaction(records []omni.Message) omni.CompactionConfig {
	var cfg omni.CompactionConfig
	for i := range records {
		m := &records[i]
		p := &m.Payload
		if m.Type != omni.KindEvent || p.Type != omni.TypeCompactionBegin || len(m.Origin) > 0 {
			continue
		}
		switch p.Reason {
		case omni.CompactContext:
			if p.Context > 0 && (cfg.MaxContextLength == 0 || p.Context < cfg.MaxContextLength) {
				cfg.MaxContextLength = p.Context
			}
		case omni.CompactTurns:
			if p.Turns > 0 && (cfg.MaxSessionTurns == 0 || p.Turns < cfg.MaxSessionTurns) {
				cfg.MaxSessionTurns = p.Turns
			}
		}
		if cfg.Mode == "" && p.Mode != omni.ModeSummarize {
			cfg.Mode = p.Mode
		}
	}
	return cfg
}

// A task is one recorded Task to run again.
type task struct {
	from   int // the index of the record that begins it
	kind   string
	input  []omni.InputPart
	steers []steer
	abort  *abortPoint
	// The hooks' part (hooks.go): the stop points' records, the harness
	// context texts before the Prompt, the refusal of a refused Prompt.
	stops    []stopGroup
	contexts []string
	refusal  *refusalRec
}

// An abortPoint is where a recorded Task was aborted by its user: the
// replayer sends the abort once the replayed Trace holds at records (the
// first record the abort caused) and each of calls (tools the abort
// interrupted) has stalled in the replay toolrunner.
type abortPoint struct {
	at    int
	calls []string
}

// abortCaused reports whether m is a record a user abort leaves before
// its abort event: an aborted request's token_usage and request_end, an
// interrupted tool output, an aborted compaction's end.
func abortCaused(records []omni.Message, i int) bool {
	m := &records[i]
	p := &m.Payload
	if len(m.Origin) > 0 {
		return false
	}
	switch {
	case m.Type == omni.KindEvent && (p.Type == omni.TypeRequestEnd || p.Type == omni.TypeCompactionEnd):
		return p.Status == omni.StatusAborted
	case m.Type == omni.KindEvent && p.Type == omni.TypeTokenUsage:
		return i+1 < len(records) && records[i+1].Type == omni.KindEvent &&
			records[i+1].Payload.Type == omni.TypeRequestEnd && records[i+1].Payload.Status == omni.StatusAborted
	case m.Type == omni.KindModel && p.Type == omni.TypeToolCallOutput:
		return p.Stop() == omni.StatusAborted && strings.HasSuffix(p.Output, omni.InterruptedOutput)
	}
	return false
}

// abortAt is the abort point of the abort event at records[i].
func abortAt(records []omni.Message, i int) *abortPoint {
	ap := &abortPoint{at: i}
	for ap.at > 0 && abortCaused(records, ap.at-1) {
		ap.at--
	}
	for j := ap.at; j < i; j++ {
		if p := &records[j].Payload; p.Type == omni.TypeToolCallOutput {
			ap.calls = append(ap.calls, p.ToolCallID)
		}
	}
	return ap
}

// A steer is steering sent to a running Task once the replayed Trace holds
// at records: the engine takes steering before its next request (or after
// an answer without calls), so a steering record is replayed by sending it
// once the request before it has begun.
type steer struct {
	text string
	at   int
}

// plan finds the recorded Tasks: a group of user inputs (texts, images)
// outside any request after something else begins a Task; a manual
// compaction between Tasks is a compaction Task.
func plan(records []omni.Message) []task {
	var out []task
	inRequest, compacting, input := false, false, false
	lastBegin := -1       // the index of the last request_begin of the Session
	var contexts []string // harness texts waiting for their Prompt
	for i := range records {
		m := &records[i]
		p := &m.Payload
		isInput := false
		if body, ok := omni.ParseBlock(p.Text, omni.TagUserSteering); ok && m.Type == omni.KindModel && p.Role == omni.RoleUser &&
			p.Type == omni.TypeText && len(m.Origin) == 0 && len(out) > 0 {
			at := i // no request before it in this Task: as soon as it runs
			if lastBegin >= 0 {
				at = lastBegin + 1
			}
			out[len(out)-1].steers = append(out[len(out)-1].steers, steer{text: body, at: at})
			input = false
			continue
		}
		afterStop := i > 0 && isStopHook(records, i-1)
		switch {
		case isStopHook(records, i) && len(out) > 0:
			r, _ := hookOf(records, i)
			t := &out[len(out)-1]
			if !afterStop {
				t.stops = append(t.stops, stopGroup{at: i})
			}
			g := &t.stops[len(t.stops)-1]
			g.recs = append(g.recs, r)
		case m.Type == omni.KindModel && p.Role == omni.RoleUser && p.Type == omni.TypeText && p.Sender == omni.SenderHarness && len(m.Origin) == 0:
			if afterStop {
				g := &out[len(out)-1].stops
				(*g)[len(*g)-1].input = p.Text
			} else if !inRequest && !compacting {
				contexts = append(contexts, p.Text)
			}
		case !inRequest && !compacting && len(m.Origin) == 0 && isRefusal(m):
			r, _ := parseRefusal(m)
			out = append(out, task{kind: omni.TaskRun, input: []omni.InputPart{{Type: "text", Text: refusedPrompt}}, refusal: &r, from: i})
			contexts = nil
		case m.Type == omni.KindEvent && p.Type == omni.TypeAbort && len(m.Origin) == 0 && len(out) > 0:
			out[len(out)-1].abort = abortAt(records, i)
			inRequest, compacting = false, false
		case m.Type == omni.KindEvent && p.Type == omni.TypeRequestBegin:
			inRequest = true
			if !compacting {
				lastBegin = i
			}
		case m.Type == omni.KindEvent && p.Type == omni.TypeRequestEnd:
			inRequest = false
		case m.Type == omni.KindEvent && p.Type == omni.TypeCompactionBegin:
			compacting = true
			if p.Reason == omni.CompactManual {
				out = append(out, task{kind: omni.TaskCompact, from: i})
			}
		case m.Type == omni.KindEvent && p.Type == omni.TypeCompactionEnd:
			compacting = false
		case m.Type == omni.KindModel && !inRequest && !compacting && p.Role == omni.RoleUser && p.Sender == "" &&
			(p.Type == omni.TypeText || p.Type == omni.TypeImageURL):
			if _, ok := omni.ParseBlock(p.Text, omni.TagContextSummary); ok {
				break
			}
			isInput = true
			part := omni.InputPart{Type: "text", Text: p.Text}
			if p.Type == omni.TypeImageURL {
				part = omni.InputPart{Type: "image_url", ImageURL: p.ImageURL}
			}
			if input {
				out[len(out)-1].input = append(out[len(out)-1].input, part)
			} else {
				out = append(out, task{kind: omni.TaskRun, input: []omni.InputPart{part}, contexts: contexts, from: i})
				contexts = nil
			}
		}
		if m.Type != omni.KindSessionMeta {
			input = isInput
		}
	}
	return out
}

// isStopHook reports whether records[i] is a stop hook's record.
func isStopHook(records []omni.Message, i int) bool {
	r, ok := hookOf(records, i)
	return ok && r.Point == omni.HookStop
}

func isRefusal(m *omni.Message) bool {
	_, ok := parseRefusal(m)
	return ok
}

// A decision is a recorded approval_decision, its record's index, and
// the recorded Task (plan's index) its call belongs to.
type decision struct {
	decision string
	index    int
	task     int // -1: any Task
	used     bool
}

// asks are the recorded decisions of the calls the replay's engine asks
// about (always-ask), per tool call id in record order. An id may recur
// (a scripted model's ids, a fork continuing past a call it carries), so
// a request about an id in Task t is answered by the first unused
// decision of that id in Task t. A call the record has no decision for
// (its Task was aborted, or forked, first) has none: its request, if the
// engine gets to ask before the abort, is answered only after the pacing
// bound, when nobody waits for it any more. Calls the engine
// decides without asking (forbidden by the command policy, denied by a
// pre_tool_use hook) are not in it.
//
// Concurrency: runTask's follower callback is its only user.
type asks struct {
	byID map[string][]decision
}

// approvals finds the asked calls of records and their decisions; tasks
// are plan's Tasks of records.
func approvals(records []omni.Message, tasks []task) *asks {
	a := &asks{byID: map[string][]decision{}}
	type call struct{ task, index int }
	open := map[string]call{} // id → its latest call still without a decision
	hookDenied := map[string]bool{}
	t := -1
	for i := range records {
		for t+1 < len(tasks) && tasks[t+1].from <= i {
			t++
		}
		m := &records[i]
		p := &m.Payload
		if len(m.Origin) > 0 {
			continue
		}
		id := p.ToolCallID
		switch {
		case m.Type == omni.KindModel && p.Type == omni.TypeToolCall && p.Stop() == omni.StatusCompleted:
			open[id] = call{task: t, index: i}
			delete(hookDenied, id)
		case m.Type == omni.KindEvent && p.Type == omni.TypeHook:
			if r, ok := p.Hook(); ok && r.Point == omni.HookPreToolUse && r.Decision == omni.DecisionDeny {
				hookDenied[id] = true
			}
		case m.Type == omni.KindEvent && p.Type == omni.TypeApprovalDecision:
			c, ok := open[id]
			if !ok {
				continue
			}
			delete(open, id)
			if p.Decision == omni.DecisionForbidden || hookDenied[id] {
				continue // decided without asking
			}
			a.byID[id] = append(a.byID[id], decision{decision: p.Decision, index: i, task: c.task})
		}
	}
	return a
}

// next returns the decision for a request about call id in Task t; ok is
// false when the record has none left there.
func (a *asks) next(t int, id string) (decision, bool) {
	ds := a.byID[id]
	for k := range ds {
		if !ds[k].used && (ds[k].task == t || ds[k].task < 0) {
			ds[k].used = true
			return ds[k], true
		}
	}
	return decision{}, false
}

// last returns the last recorded decision for call id (a subagent
// child's call, answered from the child's record).
func (a *asks) last(id string) (decision, bool) {
	ds := a.byID[id]
	for k := len(ds) - 1; k >= 0; k-- {
		if ds[k].decision != "" {
			return ds[k], true
		}
	}
	return decision{}, false
}

// runTask submits one Task and answers its approval requests until it
// ends.
func runTask(ctx context.Context, st *stack.Stack, sid, id string, n int, t task, decisions *asks, pc *pacer, kids *childRecords) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	last, err := bus.LastSeq(ctx, st.JS)
	if err != nil {
		return err
	}
	if _, err := st.Sessions.Begin(ctx, sid, omni.StateRunning, id); err != nil {
		return fmt.Errorf("reexec: begin task: %w", err)
	}
	if _, err := bus.SubmitTask(ctx, st.JS, &omni.Task{ID: id, Kind: t.kind, SessionID: sid, Input: t.input}, nil); err != nil {
		return fmt.Errorf("reexec: %w", err)
	}
	var steering sync.WaitGroup
	defer steering.Wait()
	sctx, stopSteering := context.WithCancel(ctx)
	defer stopSteering()
	if ap := t.abort; ap != nil && pc != nil {
		steering.Add(1)
		go func() {
			defer steering.Done()
			if pc.waitAbort(sctx, sid, ap.at) != nil {
				return
			}
			for _, id := range ap.calls {
				if pc.waitStall(sctx, sid+"/"+id) != nil {
					return
				}
			}
			_, _ = st.Conn.RequestWithContext(sctx, omni.ControlSubject(sid, omni.CtlAbort), nil)
		}()
	}
	for _, s := range t.steers {
		steering.Add(1)
		go func() {
			defer steering.Done()
			if pc != nil && pc.wait(sctx, sid, s.at) != nil {
				return
			}
			body, err := omni.Pack(&omni.Control{Text: s.text})
			if err == nil {
				_, _ = st.Conn.RequestWithContext(sctx, omni.ControlSubject(sid, omni.CtlSteer), body)
			}
		}()
	}
	err = bus.FollowUntil(ctx, st.JS, sid, []string{omni.ClassServer}, last+1, false, func(sm bus.StreamMsg) error {
		var ev omni.ServerEvent
		if json.Unmarshal(sm.Data, &ev) != nil {
			return nil
		}
		switch {
		case ev.Type == omni.ServerTaskState && ev.State == omni.StateIdle && ev.TaskID == id:
			return bus.ErrStop
		case ev.Type == omni.ServerApprovalRequest && len(ev.Origin) > 0:
			// A subagent child's call, answered from the child's record.
			steering.Add(1)
			go func() {
				defer steering.Done()
				answerChild(sctx, st, ev, pc, kids)
			}()
		case ev.Type == omni.ServerApprovalRequest && len(ev.Origin) == 0:
			var call omni.Message
			if omni.Unmarshal(ev.ToolCall, &call) != nil {
				return nil
			}
			rd, ok := decisions.next(n, call.Payload.ToolCallID)
			if !ok && pc != nil {
				// No decision of this Task's: the recorded call got
				// none (its Task was aborted, or forked, first: the
				// abort comes meanwhile and nobody waits for the
				// answer), or the replay parted from the record. Allow
				// after the bound, as a wait for a position would.
				if err := pc.wait(ctx, sid, math.MaxInt); err != nil {
					return err
				}
			}
			d := omni.DecisionAllow
			if ok && rd.decision == omni.DecisionDeny {
				d = omni.DecisionDeny
			}
			if ok && pc != nil {
				if err := pc.wait(ctx, sid, rd.index); err != nil {
					return err
				}
			}
			body, err := omni.Pack(&omni.Control{ToolCallID: call.Payload.ToolCallID, Decision: d})
			if err != nil {
				return err
			}
			_, err = st.Conn.RequestWithContext(ctx, omni.ControlSubject(sid, omni.CtlApprove), body)
			if errors.Is(err, nats.ErrNoResponders) {
				// The Task no longer runs (a replay that parted from
				// the record ended it): nobody waits for the answer,
				// and the difference shows in the comparison.
				return nil
			}
			if err != nil {
				return fmt.Errorf("reexec: answer approval of %s: %w", call.Payload.ToolCallID, err)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, bus.ErrStop) {
		return fmt.Errorf("reexec: task %s: %w", id, err)
	}
	return nil
}

// answerChild answers a subagent child's approval request (forwarded with
// its origin) as the child's record did, sent to the child that asks
// (the last of the origin chain).
func answerChild(ctx context.Context, st *stack.Stack, ev omni.ServerEvent, pc *pacer, kids *childRecords) {
	var call omni.Message
	if omni.Unmarshal(ev.ToolCall, &call) != nil {
		return
	}
	child := ev.Origin[len(ev.Origin)-1]
	d := omni.DecisionAllow
	if recs := kids.of(ctx, child); recs != nil {
		if rd, ok := approvals(recs, nil).last(call.Payload.ToolCallID); ok {
			if rd.decision == omni.DecisionDeny {
				d = omni.DecisionDeny
			}
			if pc.wait(ctx, child, rd.index) != nil {
				return
			}
		}
	}
	body, err := omni.Pack(&omni.Control{ToolCallID: call.Payload.ToolCallID, Decision: d})
	if err == nil {
		_, _ = st.Conn.RequestWithContext(ctx, omni.ControlSubject(child, omni.CtlApprove), body)
	}
}

// newTrace waits until the tracer has written everything of the Session
// the stream holds and returns its Trace's records.
func newTrace(ctx context.Context, st *stack.Stack, home, sid string) ([]omni.Message, error) {
	var last uint64
	if err := bus.FollowUntil(ctx, st.JS, sid, omni.TraceClasses, 0, true, func(sm bus.StreamMsg) error {
		last = sm.Seq
		return nil
	}); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, ok, err := trace.ReadPos(home, sid)
		if err == nil && ok && p.Seq >= last {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("reexec: the tracer did not write the replayed Session within 30 s")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	files, err := trace.Files(home, sid)
	if err != nil {
		return nil, err
	}
	return readAll(files)
}

// ReadFile reads the records of one Trace file.
func ReadFile(path string) ([]omni.Message, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	msgs, _, err := trace.Read(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return msgs, nil
}

// readAll reads the records of Trace files, one file after another in
// the order given (a Session's files, oldest first).
func readAll(files []string) ([]omni.Message, error) {
	var out []omni.Message
	for _, f := range files {
		msgs, err := ReadFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, msgs...)
	}
	return out, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
