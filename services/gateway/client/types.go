package client

import (
	"encoding/json"
	"strconv"
	"strings"
)

// The wire types of the gateway's HTTP API. The gateway decodes request
// bodies into them with unknown fields rejected, and encodes its responses
// from them, so this file is the API's schema.

// Session is a Session as the API shows it.
type Session struct {
	ID           string      `json:"id"`
	Model        string      `json:"model"`
	Workspace    string      `json:"workspace"`
	ApprovalMode string      `json:"approvalMode"`
	SystemPrompt string      `json:"systemPrompt,omitempty"`
	MaxTurns     int         `json:"maxTurns,omitempty"`
	Compaction   *Compaction `json:"compaction,omitempty"`
	Title        string      `json:"title,omitempty"`
	// State is idle, running or compacting.
	State string `json:"state"`
	// TaskID is the Task holding the Session while State is not idle.
	TaskID string `json:"taskId,omitempty"`
	// LastStatus is the outcome of the last Task (completed, failed, aborted…).
	LastStatus string `json:"lastStatus,omitempty"`
	// Parent is the parent Session of a subagent.
	Parent        string `json:"parent,omitempty"`
	CreatedAt     string `json:"createdAt"`
	CreatedUnixMs int64  `json:"createdUnixMs"`
	// CommandPolicy is the command policy snapshotted when the Session was
	// created (protocol.md §7).
	CommandPolicy *CommandPolicy `json:"commandPolicy,omitempty"`
	// ForkedFrom is where a forked Session was cut from its parent.
	ForkedFrom *ForkedFrom `json:"forkedFrom,omitempty"`
	// Sandbox is the confinement its tools run under (protocol.md §7), as the
	// tool runners report it; absent when none answers.
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	// AllowedTools are the tools allowed for the rest of the Session at an
	// approval prompt (an allow with scope "session").
	AllowedTools []string `json:"allowedTools,omitempty"`
}

// Sandbox is the tool confinement in effect: Backend is landlock, bwrap
// or off (unconfined); Network is on or off.
type Sandbox struct {
	Backend string `json:"backend"`
	Network string `json:"network"`
}

// ForkedFrom names a fork's parent Session and the stream sequence its
// history was taken up to.
type ForkedFrom struct {
	SessionID string `json:"sessionId"`
	Seq       uint64 `json:"seq"`
	// Record is the parent's record ordinal the fork was cut after, when
	// it was cut by atRecord.
	Record *int `json:"record,omitempty"`
}

// Fork is the body of POST /api/sessions/{id}/fork. AtSeq is the stream
// sequence to cut at (the <seq> of an SSE event id; a JSON number, or a
// string holding the number or a whole event id "<epoch>-<seq>"); empty:
// everything so far.
//
// AtRecord cuts after a record instead: a position from /messages
// (Messages.Positions). At most one of the two.
type Fork struct {
	AtSeq    json.RawMessage `json:"atSeq,omitempty"`
	AtRecord *int            `json:"atRecord,omitempty"`
}

// CommandPolicy is a Session's command policy: deny rules matched against
// exec_command's normalized cmd before any approval mode. Source is
// "factory", "off" or the rules file's path.
type CommandPolicy struct {
	Source string        `json:"source"`
	Rules  []CommandRule `json:"rules"`
}

// CommandRule is one deny rule; Pattern is RE2. Enabled false keeps the
// rule listed but off.
type CommandRule struct {
	Name        string `json:"name"`
	Pattern     string `json:"pattern"`
	Description string `json:"description,omitempty"`
	Enabled     *bool  `json:"enabled,omitempty"`
}

// Compaction sets when and how a Session compacts.
type Compaction struct {
	MaxContextLength int64  `json:"maxContextLength,omitempty"`
	MaxSessionTurns  int64  `json:"maxSessionTurns,omitempty"`
	Mode             string `json:"mode,omitempty"` // summarize or discard
}

// CreateSession is the body of POST /api/sessions; every field is optional.
type CreateSession struct {
	// Model is provider:model_id (default: the gateway's default model).
	Model string `json:"model,omitempty"`
	// Workspace is an absolute directory, created if missing (default
	// $FLOE_HOME/workspaces/<session id>).
	Workspace string `json:"workspace,omitempty"`
	// ApprovalMode is allow-all (default), deny-all, read-only or always-ask.
	ApprovalMode string      `json:"approvalMode,omitempty"`
	SystemPrompt string      `json:"systemPrompt,omitempty"`
	MaxTurns     int         `json:"maxTurns,omitempty"`
	Compaction   *Compaction `json:"compaction,omitempty"`
	Title        string      `json:"title,omitempty"`
}

// SessionPatch is the body of PATCH /api/sessions/{id}: nil fields are left
// as they are.
type SessionPatch struct {
	ApprovalMode *string `json:"approvalMode,omitempty"`
	Title        *string `json:"title,omitempty"`
}

// SessionList is the answer of GET /api/sessions.
type SessionList struct {
	Sessions []Session `json:"sessions"`
}

// InputPart is one part of a Task's input: {type:"text", text} or
// {type:"image_url", imageUrl}.
type InputPart struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	ImageURL string `json:"imageUrl,omitempty"`
}

// Input part types.
const (
	InputText     = "text"
	InputImageURL = "image_url"
)

// TaskRequest is the body of POST /api/sessions/{id}/tasks.
type TaskRequest struct {
	Input         []InputPart `json:"input"`
	ThinkingLevel string      `json:"thinkingLevel,omitempty"`
}

// TaskAccepted answers an accepted Task or compaction (202).
type TaskAccepted struct {
	TaskID string `json:"taskId"`
}

// Messages is the answer of GET /api/sessions/{id}/messages.
type Messages struct {
	// Messages is the history: every Trace record, plus the complete messages
	// the tracer has not written yet, as OmniMessage JSON.
	Messages []json.RawMessage `json:"messages"`
	// Positions, when present, are the messages' record ordinals, one per
	// message: the cut token of POST /fork {atRecord}. Absent when the
	// history's records could not all be placed (a damaged Trace).
	Positions []int `json:"positions,omitempty"`
	// Window is set on a windowed answer (MessagesWindow).
	Window *Window `json:"window,omitempty"`
	// Live is set while a Task runs (never on a page before a cursor).
	Live *Live `json:"live,omitempty"`
}

// Window says where a windowed answer of /messages starts
// (docs/history-window.md).
type Window struct {
	// Start is the cursor of the page before this one (its before=).
	Start string `json:"start"`
	// More is true when there is such a page.
	More bool `json:"more"`
}

// Live is the in-progress part of a running Task.
type Live struct {
	// Cursor is the last stream position the answer reflects, in the SSE id
	// format "<epoch>-<seq>": an SSE event of the same epoch whose sequence
	// is at or below it is already in Messages or Fragments (server events
	// excepted, which are never in them). CursorSeq splits it.
	Cursor string `json:"cursor"`
	// Fragments holds one synthetic partial start fragment per segment still
	// open, carrying everything streamed so far (origin kept).
	Fragments []json.RawMessage `json:"fragments"`
}

// CursorSeq returns the stream sequence of l.Cursor; ok is false when the
// cursor is not in the "<epoch>-<seq>" form.
func (l *Live) CursorSeq() (seq uint64, ok bool) {
	_, seq, ok = ParseEventID(l.Cursor)
	return seq, ok
}

// ParseEventID splits an SSE event id "<epoch>-<seq>".
func ParseEventID(id string) (epoch int64, seq uint64, ok bool) {
	e, q, found := strings.Cut(strings.TrimSpace(id), "-")
	if !found {
		return 0, 0, false
	}
	epoch, err1 := strconv.ParseInt(e, 10, 64)
	seq, err2 := strconv.ParseUint(q, 10, 64)
	return epoch, seq, err1 == nil && err2 == nil
}

// ImportTrace is the body of POST /api/traces/import: a Trace file (JSONL,
// written by Floe or by the original harness), base64-encoded.
type ImportTrace struct {
	DataBase64 string `json:"dataBase64"`
	// Model overrides the model the Trace's session_meta names
	// (provider:model_id).
	Model string `json:"model,omitempty"`
	// Workspace replaces the Trace's Workspace (required when that one
	// does not exist here).
	Workspace string `json:"workspace,omitempty"`
}

// Imported is the answer of POST /api/traces/import.
type Imported struct {
	SessionID string `json:"sessionId"`
	Index     int    `json:"index"`
	Date      string `json:"date"` // the date directory, yyyy-mm-dd
}

// Decision is the body of POST /api/sessions/{id}/approvals/{toolCallId}.
type Decision struct {
	Decision string `json:"decision"` // allow or deny
	// Scope "session" (with allow) also allows the call's tool for the
	// rest of the Session (Session.AllowedTools); "" the call alone.
	Scope string `json:"scope,omitempty"`
}

// Steer is the body of POST /api/sessions/{id}/steer.
type Steer struct {
	Text string `json:"text"`
}

// RetryNowResult answers POST /api/sessions/{id}/retry-now.
type RetryNowResult struct {
	Skipped bool `json:"skipped"`
}

// TraceFile describes one Trace file of a Session.
type TraceFile struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	Size  int64  `json:"size"`
}

// TraceList is the answer of GET /api/sessions/{id}/traces.
type TraceList struct {
	Traces []TraceFile `json:"traces"`
}

// ErrorBody is the shape of every error answer.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is a machine code and a human message.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Health answers GET /healthz.
type Health struct {
	Status string `json:"status"`
}
