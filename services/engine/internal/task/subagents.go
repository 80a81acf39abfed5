package task

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
)

// SubagentTool is the engine's own tool: it runs a child Session.
const SubagentTool = "run_subagent"

// SubagentSpec describes run_subagent to the model.
func SubagentSpec() omni.ToolSpec {
	return omni.ToolSpec{
		Name: SubagentTool,
		Description: "Delegate a self-contained sub-task to a subagent: a child Session with the same tools in the same Workspace. " +
			"Its final answer is returned as this tool's output.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"description":{"type":"string","description":"A short label for the sub-task"},"prompt":{"type":"string","description":"The complete instructions for the subagent"}},"required":["description","prompt"],"additionalProperties":false}`),
		Permission: "rw",
	}
}

type subagentArgs struct {
	Description string `json:"description"`
	Prompt      string `json:"prompt"`
}

// subagents run the child Sessions of the Task's run_subagent calls: each
// child is created and its Task started here, its stream forwarded onto
// this Session's nested subject, its approval requests surfaced here (and
// their decisions passed back), and it is aborted with this Task.
//
// Concurrency: run is called on a goroutine the approvals own (one per
// call) and owns the child's abort watcher, joined before it returns;
// forwardApproval and pendingEvents are called by the control inbox's
// goroutine; abortAll by Run after the workers are joined. mu guards
// children and approvals, and is never held across a request.
type subagents struct {
	d     *Deps
	log   zerolog.Logger
	sid   string
	task  omni.Task
	rec   *omni.SessionRecord
	prod  *producers
	abort *abortScope

	mu        sync.Mutex
	children  map[string]string        // running child Session → its Task
	approvals map[string]childApproval // a child's pending calls
}

func newSubagents(d *Deps, log zerolog.Logger, t omni.Task, rec *omni.SessionRecord, prod *producers, abort *abortScope) *subagents {
	return &subagents{d: d, log: log, sid: t.SessionID, task: t, rec: rec, prod: prod, abort: abort,
		children: make(map[string]string), approvals: make(map[string]childApproval)}
}

// pendingEvents returns the children's approval requests still unanswered.
func (s *subagents) pendingEvents() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	var p [][]byte
	for _, ca := range s.approvals {
		p = append(p, ca.event)
	}
	return p
}

// run runs a child Session for one run_subagent call: its own
// subjects and Trace, every message republished on this Session's nested
// subject with the child id prepended to origin, its approval requests
// surfaced here with origin. The call's output is the child's final answer.
// ctx is the lease scope (forwarding outlives an abort), actx the abort
// scope. It returns the call's status and output, for its span ("" and
// aborted when the call was interrupted).
func (s *subagents) run(ctx, actx context.Context, tc omni.Message) (status, output string) {
	id := tc.Payload.ToolCallID
	fail := func(text string) {
		status, output = omni.StatusFailed, text
		out := omni.ToolCallOutput(id, text, omni.StatusFailed)
		if err := s.prod.publishSync(context.WithoutCancel(actx), &out, bus.OutputMsgID(s.sid, id)); err != nil {
			s.log.Error().Err(err).Msg("could not publish subagent output")
		}
	}
	var args subagentArgs
	dec := json.NewDecoder(strings.NewReader(tc.Payload.Arguments))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&args); err != nil || strings.TrimSpace(args.Prompt) == "" {
		fail(fmt.Sprintf("invalid arguments for run_subagent: want {\"description\": string, \"prompt\": string}: %v", err))
		return
	}
	if s.rec.Depth+1 > s.d.Settings.MaxSubagentDepth {
		fail(fmt.Sprintf("run_subagent: nesting depth limit (%d) reached", s.d.Settings.MaxSubagentDepth))
		return
	}
	now := time.Now().UTC()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	child := omni.NewSessionID(now, hex.EncodeToString(b))
	childTask := omni.Task{ID: "task-" + hex.EncodeToString(b) + "-" + id, Kind: omni.TaskRun, SessionID: child,
		Input: []omni.InputPart{{Type: "text", Text: args.Prompt}}, ThinkingLevel: s.task.ThinkingLevel,
		ParentSessionID: s.sid, ParentToolCallID: id}
	rec := &omni.SessionRecord{
		ID: child, Model: s.rec.Model, Workspace: s.rec.Workspace, ApprovalMode: s.rec.ApprovalMode,
		SystemPrompt: s.rec.SystemPrompt, Instructions: s.rec.Instructions, MaxTurns: s.rec.MaxTurns, Compaction: s.rec.Compaction,
		Title: args.Description, Principal: s.rec.Principal, CreatedUnixMs: now.UnixMilli(),
		State: omni.StateRunning, TaskID: childTask.ID, Parent: s.sid, Depth: s.rec.Depth + 1,
		CommandPolicy: s.rec.CommandPolicy,
	}
	if err := s.d.Sessions.Create(actx, rec); err != nil {
		fail(fmt.Sprintf("run_subagent: could not create the child Session: %v", err))
		return
	}
	ptr := omni.Subagent(child)
	s.prod.publish(&ptr, "")

	s.mu.Lock()
	s.children[child] = childTask.ID
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.children, child)
		s.mu.Unlock()
	}()

	h := nats.Header{}
	telemetry.Inject(actx, h) // the child's invoke_agent joins this trace
	if _, err := bus.SubmitTask(actx, s.d.JS, &childTask, h); err != nil {
		fail(fmt.Sprintf("run_subagent: could not start the child Task: %v", err))
		return
	}
	// Forwarding outlives a user abort: the child is aborted and its
	// stream forwarded to its end, so the parent's abort (published once
	// this returns) comes after everything of the child's.
	fctx, stopForwarding := context.WithCancel(ctx)
	defer stopForwarding()
	// The abort watcher is owned here and joined before the call ends.
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-actx.Done():
		case <-fctx.Done():
			return
		}
		if !s.abort.aborted() {
			return // the engine is stopping or lost the lease: fctx ends too
		}
		bound := time.NewTimer(childAbortWait + s.d.Settings.CancelWait)
		defer bound.Stop()
		s.abortChild(fctx, child, childTask.ID)
		select {
		case <-bound.C:
			s.log.Warn().Str("child", child).Msg("aborted child session did not end in time; no longer forwarded")
			stopForwarding()
		case <-fctx.Done():
		}
	}()
	answer, childStatus, err := s.forward(fctx, child, childTask.ID)
	stopForwarding()
	<-watched
	if actx.Err() != nil {
		// Abort (the child was stopped too; the call counts as
		// interrupted) or shutdown (the Task is resumed elsewhere).
		return omni.StatusAborted, ""
	}
	if err != nil {
		fail(fmt.Sprintf("run_subagent: lost the child Session %s: %v", child, err))
		return
	}
	stop := ""
	if childStatus != omni.StatusCompleted {
		stop = omni.StatusFailed
		answer = fmt.Sprintf("[subagent %s %s] %s", child, childStatus, answer)
	}
	if strings.TrimSpace(answer) == "" {
		answer = omni.NoOutput
	}
	out := omni.ToolCallOutput(id, answer, stop)
	if err := s.prod.publishSync(actx, &out, bus.OutputMsgID(s.sid, id)); err != nil && !s.abort.aborted() {
		s.log.Error().Err(err).Msg("could not publish subagent output")
	}
	return out.Payload.Stop(), answer
}

// forward republishes the child's stream under this Session until
// the child's Task ends; it returns the child's final answer and status.
//
// Forwarding is a producer of its own (pkg/bus/publish), fenced by the
// Task's lease: the child's messages keep their order on the nested
// subject. A forwarded message the stream lost fails the forwarding, and
// with it the call (the child's own stream and Trace are intact).
func (s *subagents) forward(ctx context.Context, child, childTask string) (answer, status string, err error) {
	nested := s.prod.nested()
	defer nested.Close()
	defer func() {
		if _, serr := nested.Settle(context.WithoutCancel(ctx)); serr != nil && err == nil {
			err = fmt.Errorf("forwarding to the nested subject: %w", serr)
		}
	}()
	var last string
	err = bus.FollowUntil(ctx, s.d.JS, child, []string{omni.ClassMeta, omni.ClassPartial, omni.ClassModel, omni.ClassEvent, omni.ClassNested, omni.ClassServer}, 0, false, func(sm bus.StreamMsg) error {
		if sm.Class == omni.ClassServer {
			var ev omni.ServerEvent
			if json.Unmarshal(sm.Data, &ev) != nil {
				return nil
			}
			switch ev.Type {
			case omni.ServerTaskState:
				if ev.State == omni.StateIdle && ev.TaskID == childTask {
					status = ev.Status
					return bus.ErrStop
				}
			case omni.ServerApprovalRequest:
				ev.Origin = append([]string{child}, ev.Origin...)
				var tc omni.Message
				if omni.Unmarshal(ev.ToolCall, &tc) == nil {
					b, _ := json.Marshal(ev)
					s.mu.Lock()
					s.approvals[tc.Payload.ToolCallID] = childApproval{session: child, event: b}
					s.mu.Unlock()
				}
				// The forwarded call is stored before its approval request.
				_, _ = nested.Settle(ctx)
				if _, err := s.prod.server(ctx, ev, ""); err != nil {
					return err
				}
			}
			return nil
		}
		m, derr := omni.Decode(sm.Data)
		if derr != nil {
			s.log.Warn().Err(derr).Str("child", child).Msg("undecodable child message not forwarded")
			return nil
		}
		if len(m.Origin) == 0 && m.Type == omni.KindModel && m.Payload.Type == omni.TypeText &&
			m.Payload.Role == omni.RoleAssistant && m.Payload.Stop() == omni.StatusCompleted {
			last = m.Payload.Text
		}
		if m.Type == omni.KindEvent && m.Payload.Type == omni.TypeApprovalDecision {
			s.mu.Lock()
			delete(s.approvals, m.Payload.ToolCallID)
			s.mu.Unlock()
		}
		fwd := m.WithOrigin(child)
		nm, perr := bus.SessionMsgClass(s.sid, omni.ClassNested, &fwd, "")
		if perr != nil {
			return perr
		}
		return nested.Publish(ctx, nm)
	})
	return last, status, err
}

type childApproval struct {
	session string
	event   []byte
}

// forwardApproval passes a decision for a child's pending call to the child
// Session's engine; ok is false when no child waits on that call.
func (s *subagents) forwardApproval(c omni.Control) (omni.ControlReply, bool) {
	s.mu.Lock()
	ca, ok := s.approvals[c.ToolCallID]
	s.mu.Unlock()
	if !ok {
		return omni.ControlReply{}, false
	}
	body, _ := omni.Pack(&c)
	m, err := s.d.NC.Request(omni.ControlSubject(ca.session, omni.CtlApprove), body, 5*time.Second)
	if err != nil {
		return omni.ControlReply{Code: omni.CodeNotFound, Message: err.Error()}, true
	}
	var rep omni.ControlReply
	if err := omni.Unpack(m.Data, &rep); err != nil {
		return omni.ControlReply{Code: omni.CodeInternal, Message: err.Error()}, true
	}
	return rep, true
}

// childAbortWait bounds how long an aborted parent waits for a child's Task
// to end (beyond the child's own CancelWait).
const childAbortWait = 10 * time.Second

// abortChild asks the engine running the child's Task to abort it. A child
// Task not yet picked up has no responder: it is asked again until it
// answers, its Task ended, or ctx ends.
func (s *subagents) abortChild(ctx context.Context, child, childTask string) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.d.NC.RequestWithContext(rctx, omni.ControlSubject(child, omni.CtlAbort), nil)
		cancel()
		if err == nil {
			return
		}
		if rec, _, gerr := s.d.Sessions.Get(ctx, child); gerr == nil && rec.TaskID != childTask {
			return // the child's Task already ended
		}
		_ = retry.Sleep(ctx, 50*time.Millisecond)
	}
}

// abortAll aborts every running child Session and waits (bounded)
// until their Tasks ended, so nothing of theirs is forwarded after this
// Session's abort.
func (s *subagents) abortAll(ctx context.Context) {
	s.mu.Lock()
	children := make(map[string]string, len(s.children))
	for k, v := range s.children {
		children[k] = v
	}
	s.mu.Unlock()
	for child := range children {
		if _, err := s.d.NC.Request(omni.ControlSubject(child, omni.CtlAbort), nil, 5*time.Second); err != nil && err != nats.ErrNoResponders {
			s.log.Warn().Err(err).Str("child", child).Msg("could not abort child session")
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(children) > 0 && time.Now().Before(deadline) {
		for child, taskID := range children {
			rec, _, err := s.d.Sessions.Get(ctx, child)
			if err != nil || rec.TaskID != taskID {
				delete(children, child)
			}
		}
		_ = retry.Sleep(ctx, 20*time.Millisecond)
	}
}
