package task

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/omni/cmdpolicy"
	"floe.dev/services/engine/internal/hooks"
)

var errAborted = errors.New("task aborted by user")

// abortScope is the Task's abort scope: Run's actx, which a user abort
// ends (and with it the model stream, approvals and the wait for
// outputs), while the lease scope goes on for what the Task publishes
// after an abort.
//
// Concurrency: Run sets cancel before the control inbox starts; byUser is
// called from the control inbox's goroutine, aborted from any goroutine
// (user is an atomic).
type abortScope struct {
	cancel context.CancelCauseFunc
	user   atomic.Bool
}

// byUser serves a user's abort: it ends the abort scope.
func (a *abortScope) byUser() {
	a.user.Store(true)
	a.cancel(errAborted)
}

// aborted reports a user abort (not an engine shutdown or a lost lease).
func (a *abortScope) aborted() bool { return a.user.Load() }

// approval is a call waiting for a human decision.
type approval struct {
	tool     string // the call's tool
	event    []byte // approval_request server event JSON
	decision chan string
}

// approvals decide the calls of each request one at a time, in call order,
// while the model stream goes on: the Session's command policy, then its
// approval mode (read fresh, so a PATCH takes effect mid-run), then, when
// the mode asks, a human's decision. A call a pre_tool_use hook denies or
// the policy forbids is decided on the stream's consumer instead, right
// after the call (denyAtOnce), so its records have one place. An approval_decision is stored before
// its job is enqueued, so no output can precede it. An allowed call is
// dispatched (calls) or, for run_subagent, run (subagents).
//
// Concurrency: start runs one approval loop per request on a goroutine
// the approvals own; the loop and every subagent run it starts are counted
// in workers, which wait joins (Run, before the Task finishes). resolve
// and pendingEvents are called by the control inbox's goroutine. mu guards
// pending and denials (preToolUse runs on the model stream's consumer);
// toolPerms is set by setTools before the first loop starts.
type approvals struct {
	d      *Deps
	log    zerolog.Logger
	sid    string
	taskID string
	rec    *omni.SessionRecord
	prod   *producers
	calls  *calls
	subs   *subagents
	abort  *abortScope

	toolPerms map[string]string
	workers   sync.WaitGroup

	mu      sync.Mutex
	pending map[string]*approval
	denials map[string]string // tool_call_id → a pre_tool_use hook's denied output
}

// setTools records the permission of each tool the Task offers.
func (a *approvals) setTools(tools []omni.ToolSpec) {
	a.toolPerms = make(map[string]string, len(tools))
	for _, t := range tools {
		a.toolPerms[t.Name] = t.Permission
	}
}

// start decides the calls queued on queue until it is closed; done is
// closed when the loop ended. ctx is the lease scope, actx the abort
// scope.
func (a *approvals) start(ctx, actx context.Context, queue <-chan omni.Message) (done <-chan struct{}) {
	ch := make(chan struct{})
	a.workers.Add(1)
	go func() {
		defer a.workers.Done()
		defer close(ch)
		for tc := range queue {
			if a.abort.aborted() {
				continue
			}
			if err := a.one(ctx, actx, tc); err != nil && !a.abort.aborted() {
				a.log.Error().Err(err).Str("tool_call_id", tc.Payload.ToolCallID).Msg("approval failed")
			}
		}
	}()
	return ch
}

// wait joins every approval loop and subagent run.
func (a *approvals) wait() { a.workers.Wait() }

// one decides one call and enqueues its job (or runs its subagent). ctx is
// the lease scope, actx the abort scope: everything but a subagent's
// forwarding ends with actx.
func (a *approvals) one(ctx, actx context.Context, tc omni.Message) error {
	id := tc.Payload.ToolCallID
	denied := a.takeDenial(id)
	decision := omni.DecisionDeny
	var err error
	if denied == "" {
		decision, err = a.decide(actx, tc)
	}
	if errors.Is(err, errCallLost) {
		return nil // gone with its failed attempt: nothing to ask
	}
	if err != nil {
		return err
	}
	ad := omni.ApprovalDecision(decision, id)
	// Stored before the job exists: no output of this call can precede it.
	gen, from, ok := a.calls.lineage(id)
	err = errCallLost
	if ok {
		err = a.prod.publishDecision(actx, &ad, id, gen, from)
	}
	if err != nil {
		if errors.Is(err, errCallLost) {
			if ok {
				a.calls.drop(id)
			}
			return nil // gone with its failed attempt: nothing to decide
		}
		if !a.abort.aborted() {
			a.calls.undispatched(actx, id, "its approval decision was not stored: "+err.Error())
		}
		return err
	}
	if decision != omni.DecisionAllow {
		text := omni.DeniedByUser
		switch {
		case denied != "":
			text = denied
		case decision == omni.DecisionForbidden:
			text = omni.DeniedByPolicy
		}
		return a.publishDenied(actx, tc, decision, text)
	}
	if tc.Payload.Name == SubagentTool {
		a.calls.dispatched(id, 0)
		a.workers.Add(1)
		go func() {
			defer a.workers.Done()
			_, span := startTool(actx, a.d.Tel, a.sid, tc, decision)
			sctx, sactx := withSpan(ctx, actx, span)
			status, output := a.subs.run(sctx, sactx, tc)
			endTool(a.d.Tel, span, status, output)
		}()
		return nil
	}
	return a.calls.dispatch(actx, tc, a.rec.Workspace)
}

// publishDenied writes the output of a call that was not allowed (its
// decision is stored): text, stop_reason aborted.
func (a *approvals) publishDenied(actx context.Context, tc omni.Message, decision, text string) error {
	id := tc.Payload.ToolCallID
	_, span := startTool(actx, a.d.Tel, a.sid, tc, decision)
	endTool(a.d.Tel, span, omni.StatusAborted, text)
	out := omni.ToolCallOutput(id, text, omni.StatusAborted)
	return a.prod.publishSync(actx, &out, bus.OutputMsgID(a.sid, id))
}

// denyAtOnce decides, on the model stream's consumer, a call no person
// decides: denied by a pre_tool_use hook (preToolUse ran) or forbidden by
// the command policy. Its approval_decision and its output are stored
// before the consumer takes the stream's next message, so they come right
// after the call and its hook records, before the request's next call,
// token_usage and request_end: one place, whatever the timing, as in the
// original, whose approvals run inline on the model stream. A replay
// (floe replay --execute) then writes them where they were recorded.
//
// It reports whether the call is decided; false leaves it to the approval
// loop (queued as any call): nothing to deny at once, a user abort, or a
// decision the stream did not confirm (the loop's publishDecision reads the
// call back once the request's recovery ran; waiting for that here, on
// the consumer the recovery waits for, would stall both).
func (a *approvals) denyAtOnce(actx context.Context, tc omni.Message) bool {
	id := tc.Payload.ToolCallID
	if a.abort.aborted() {
		return false
	}
	a.mu.Lock()
	text := a.denials[id]
	a.mu.Unlock()
	decision := omni.DecisionDeny
	if text == "" {
		if !a.policyForbids(tc) {
			return false
		}
		decision, text = omni.DecisionForbidden, omni.DeniedByPolicy
	}
	gen, _, ok := a.calls.lineage(id)
	if !ok {
		return false
	}
	ad := omni.ApprovalDecision(decision, id)
	if err := a.prod.publishDecisionOnce(actx, &ad, gen); err != nil {
		return false
	}
	a.takeDenial(id)
	if err := a.publishDenied(actx, tc, decision, text); err != nil && !a.abort.aborted() {
		a.log.Error().Err(err).Str("tool_call_id", id).Msg("approval failed")
	}
	return true
}

// preToolUse runs the pre_tool_use hooks on tc (protocol.md §7), before the
// command policy and the approval mode. It is called by the model stream's
// consumer right after it published the call, and holds the stream while
// the hooks run, so their records come right after the call (the original's
// order) and before its decision. A deny wins outright: the call's output
// will be "Tool call denied by the <name> hook: <reason>." (takeDenial).
func (a *approvals) preToolUse(actx context.Context, tc *omni.Message) {
	if !a.d.Hooks.Has(omni.HookPreToolUse) {
		return
	}
	p := &tc.Payload
	out := a.d.Hooks.Run(actx, hooks.Input{Point: omni.HookPreToolUse, SessionID: a.sid, TaskID: a.taskID,
		Workspace: a.rec.Workspace, ToolName: p.Name, ToolCallID: p.ToolCallID, Arguments: p.Arguments})
	if a.abort.aborted() {
		return // the records of hooks cut by the abort are not stored
	}
	for _, rec := range out.Records {
		m := omni.HookEvent(rec)
		a.prod.publish(&m, "")
	}
	if !out.Deny {
		return
	}
	a.log.Info().Str("tool_call_id", p.ToolCallID).Str("hook", out.By).Msg("a pre_tool_use hook denies the call")
	a.mu.Lock()
	if a.denials == nil {
		a.denials = make(map[string]string)
	}
	a.denials[p.ToolCallID] = omni.DeniedByHook(out.By, out.Reason)
	a.mu.Unlock()
}

// takeDenial returns (and forgets) the output of a call a pre_tool_use
// hook denied; "" when none did.
func (a *approvals) takeDenial(id string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.denials[id]
	delete(a.denials, id)
	return d
}

// decide applies the Session's command policy, then its approval mode,
// read fresh so a PATCH takes effect mid-run; a human decision is awaited
// when the mode asks.
func (a *approvals) decide(actx context.Context, tc omni.Message) (string, error) {
	if a.policyForbids(tc) {
		return omni.DecisionForbidden, nil
	}
	mode, allowed := a.rec.ApprovalMode, a.rec.AllowedTools
	if rec, _, err := a.d.Sessions.Get(actx, a.sid); err == nil {
		mode, allowed = rec.ApprovalMode, rec.AllowedTools
	}
	switch mode {
	case omni.ApproveDenyAll:
		return omni.DecisionDeny, nil
	case omni.ApproveReadOnly:
		if a.toolPerms[tc.Payload.Name] == "r" {
			return omni.DecisionAllow, nil
		}
	case omni.ApproveAlwaysAsk:
	default:
		return omni.DecisionAllow, nil
	}
	if slices.Contains(allowed, tc.Payload.Name) {
		return omni.DecisionAllow, nil // allowed for the rest of the Session
	}
	return a.ask(actx, tc)
}

// execTool is the tool the command policy applies to.
const execTool = "exec_command"

// policyForbids matches an exec_command's cmd against the command policy
// snapshotted in the Session record (protocol.md §7).
func (a *approvals) policyForbids(tc omni.Message) bool {
	if tc.Payload.Name != execTool {
		return false
	}
	var args struct {
		Cmd string `json:"cmd"`
	}
	if json.Unmarshal([]byte(tc.Payload.Arguments), &args) != nil || args.Cmd == "" {
		return false // the tool itself reports the bad arguments
	}
	m, err := cmdpolicy.Compile(a.rec.CommandPolicy)
	if err != nil {
		// Checked when the policy was loaded; a record that still fails
		// is treated as denying everything it was meant to catch.
		a.log.Error().Err(err).Msg("command policy does not compile; exec_command forbidden")
		return true
	}
	rule, hit := m.Match(args.Cmd)
	if hit {
		a.log.Info().Str("tool_call_id", tc.Payload.ToolCallID).Str("rule", rule.Name).Msg("command policy forbids the call")
	}
	return hit
}

// ask publishes an approval_request and waits for the human's decision.
func (a *approvals) ask(actx context.Context, tc omni.Message) (string, error) {
	raw, err := omni.Marshal(&tc)
	if err != nil {
		return "", err
	}
	ev := omni.ServerEvent{Type: omni.ServerApprovalRequest, ToolCall: raw}
	b, _ := json.Marshal(ev)
	ap := &approval{tool: tc.Payload.Name, event: b, decision: make(chan string, 1)}
	id := tc.Payload.ToolCallID
	// Server events are another producer: the call's own message is
	// stored first, so the request never precedes the call it asks about.
	// After a loss since the call was queued, the attempt's recovery reads
	// back whether the call is on the stream (and drops it from calls when
	// not); one that is not is never asked about (nobody could answer for
	// it, and the attempt waits for its approvals).
	gen, _, _ := a.calls.lineage(id)
	a.prod.awaitStored(actx, gen)
	a.mu.Lock()
	lost := !a.calls.known(id)
	if !lost {
		a.pending[id] = ap
	}
	a.mu.Unlock()
	if lost {
		return "", errCallLost
	}
	defer func() {
		a.mu.Lock()
		delete(a.pending, id)
		a.mu.Unlock()
	}()
	if _, err := a.prod.server(actx, ev, ""); err != nil {
		return "", err
	}
	select {
	case d := <-ap.decision:
		return d, nil
	case <-actx.Done():
		return "", errAborted
	}
}

// allowForSession serves an allow with omni.ScopeSession: the call's tool
// is added to the Session's AllowedTools (stored before the call is
// allowed, so every later call of the tool, in this Task or any other,
// finds it), then the call and every other call of the tool waiting in
// this Task are allowed. False when no call of this Task waits on id.
func (a *approvals) allowForSession(ctx context.Context, id string) (bool, error) {
	a.mu.Lock()
	ap := a.pending[id]
	a.mu.Unlock()
	if ap == nil {
		return false, nil
	}
	_, err := a.d.Sessions.Update(ctx, a.sid, func(rec *omni.SessionRecord) error {
		if !slices.Contains(rec.AllowedTools, ap.tool) {
			rec.AllowedTools = append(rec.AllowedTools, ap.tool)
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	a.log.Info().Str("tool", ap.tool).Msg("tool allowed for the rest of the Session")
	a.mu.Lock()
	var same []string
	for pid, p := range a.pending {
		if p.tool == ap.tool && pid != id {
			same = append(same, pid)
		}
	}
	a.mu.Unlock()
	ok := a.resolve(id, omni.DecisionAllow)
	for _, pid := range same {
		a.resolve(pid, omni.DecisionAllow)
	}
	return ok, nil
}

// resolve hands a human's decision to the call waiting for it; false when
// no call of this Task waits on id.
func (a *approvals) resolve(id, decision string) bool {
	a.mu.Lock()
	ap := a.pending[id]
	if ap != nil {
		delete(a.pending, id)
	}
	a.mu.Unlock()
	if ap == nil {
		return false
	}
	ap.decision <- decision
	return true
}

// pendingEvents returns the approval_request events still unanswered.
func (a *approvals) pendingEvents() [][]byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	var p [][]byte
	for _, ap := range a.pending {
		p = append(p, ap.event)
	}
	return p
}
