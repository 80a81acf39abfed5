// Package a2a holds Floe's A2A 1.0 view of a Task (protocol.md §9): the protocol's
// JSON wire forms (TASK_STATE_*, ROLE_*, text/data parts, stream results
// {task} / {statusUpdate} / {artifactUpdate}) and a Folder that builds a
// Task and its updates from the Session's stream.
//
// A Folder is fed one Task's messages of the Session's client stream in
// stream order. It is a pure fold, so the Task a subscriber gets first
// (everything up to a position) and the updates after it are exactly the
// stream cut at that position: nothing missing, no artifact chunk applied
// twice.
package a2a

import (
	"encoding/json"
	"fmt"
	"slices"

	"floe.dev/pkg/omni"
)

// Task states and roles, as A2A 1.0's JSON names them.
const (
	StateSubmitted     = "TASK_STATE_SUBMITTED"
	StateWorking       = "TASK_STATE_WORKING"
	StateCompleted     = "TASK_STATE_COMPLETED"
	StateFailed        = "TASK_STATE_FAILED"
	StateCanceled      = "TASK_STATE_CANCELED"
	StateInputRequired = "TASK_STATE_INPUT_REQUIRED"

	RoleUser  = "ROLE_USER"
	RoleAgent = "ROLE_AGENT"
)

// JSON-RPC and A2A error codes.
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternal       = -32603
	CodeTaskNotFound   = -32001
	CodeNotCancelable  = -32002
	CodeUnsupported    = -32004
	CodeContentType    = -32005
)

// Part is a message or artifact part: text or data.
type Part struct {
	Text      *string         `json:"text,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
	URL       string          `json:"url,omitempty"`
	Raw       string          `json:"raw,omitempty"`
	MediaType string          `json:"mediaType,omitempty"`
	Filename  string          `json:"filename,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
}

// TextPart returns a text part.
func TextPart(s string) Part { return Part{Text: &s} }

// Message is an A2A message.
type Message struct {
	MessageID string          `json:"messageId"`
	ContextID string          `json:"contextId,omitempty"`
	TaskID    string          `json:"taskId,omitempty"`
	Role      string          `json:"role"`
	Parts     []Part          `json:"parts"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
}

// Status is a Task's status.
type Status struct {
	State     string   `json:"state"`
	Message   *Message `json:"message,omitempty"`
	Timestamp string   `json:"timestamp,omitempty"`
}

// Artifact is a Task's output.
type Artifact struct {
	ArtifactID string `json:"artifactId"`
	Name       string `json:"name,omitempty"`
	Parts      []Part `json:"parts"`
}

// Task is an A2A task: a Floe Task of the Session contextId.
type Task struct {
	ID        string     `json:"id"`
	ContextID string     `json:"contextId"`
	Status    Status     `json:"status"`
	Artifacts []Artifact `json:"artifacts,omitempty"`
	History   []Message  `json:"history,omitempty"`
}

// StatusUpdate and ArtifactUpdate are the stream's updates.
type StatusUpdate struct {
	TaskID    string `json:"taskId"`
	ContextID string `json:"contextId"`
	Status    Status `json:"status"`
}

type ArtifactUpdate struct {
	TaskID    string   `json:"taskId"`
	ContextID string   `json:"contextId"`
	Artifact  Artifact `json:"artifact"`
	Append    bool     `json:"append,omitempty"`
	LastChunk bool     `json:"lastChunk,omitempty"`
}

// StreamResult is one result of a streaming method: exactly one field set.
type StreamResult struct {
	Task           *Task           `json:"task,omitempty"`
	StatusUpdate   *StatusUpdate   `json:"statusUpdate,omitempty"`
	ArtifactUpdate *ArtifactUpdate `json:"artifactUpdate,omitempty"`
}

// AnswerArtifact is the id of the artifact holding the Task's final answer.
const AnswerArtifact = "answer"

// Terminal reports whether state ends a Task.
func Terminal(state string) bool {
	return state == StateCompleted || state == StateFailed || state == StateCanceled
}

// Stops reports whether a stream ends at state: a terminal state, or input
// required (the client answers with a message on the task).
func Stops(state string) bool { return Terminal(state) || state == StateInputRequired }

type approval struct {
	id, name, args string
}

// Folder builds one Task from the Session's stream.
type Folder struct {
	task      Task
	started   bool
	pending   []approval
	answer    string // the answer artifact's text so far
	streaming bool   // an assistant text is streaming into the answer
	skipText  int
	promptSet bool
}

// NewFolder returns the Folder of the Task taskID of the Session contextID,
// submitted and not yet started.
func NewFolder(taskID, contextID string) *Folder {
	return &Folder{task: Task{ID: taskID, ContextID: contextID, Status: Status{State: StateSubmitted}}}
}

// Task returns the Task as folded so far (a copy).
func (f *Folder) Task() Task {
	t := f.task
	t.History = slices.Clone(t.History)
	if f.answer != "" || f.streaming {
		t.Artifacts = []Artifact{{ArtifactID: AnswerArtifact, Name: AnswerArtifact, Parts: []Part{TextPart(f.answer)}}}
	}
	return t
}

// State is the Task's state so far.
func (f *Folder) State() string { return f.task.Status.State }

// Pending returns the tool call ids awaiting approval, oldest first.
func (f *Folder) Pending() []string {
	ids := make([]string, len(f.pending))
	for i, p := range f.pending {
		ids[i] = p.id
	}
	return ids
}

// Feed folds one message (server: the server class) and returns the
// updates it yields.
func (f *Folder) Feed(seq uint64, server bool, data []byte) []StreamResult {
	if Terminal(f.task.Status.State) {
		return nil
	}
	if server {
		return f.server(data)
	}
	if !f.started {
		return nil
	}
	msg, err := omni.Decode(data)
	if err != nil || len(msg.Origin) > 0 {
		return nil // subagents' messages are theirs, not this Task's output
	}
	p := &msg.Payload
	switch p.Type {
	case omni.TypeText:
		if p.Role == omni.RoleUser {
			if !f.promptSet && p.Sender == "" {
				f.promptSet = true
				f.task.History = append(f.task.History, Message{MessageID: fmt.Sprintf("msg-%d", seq),
					ContextID: f.task.ContextID, TaskID: f.task.ID, Role: RoleUser, Parts: []Part{TextPart(p.Text)}})
			}
			return nil
		}
		if p.Role != omni.RoleAssistant {
			return nil
		}
		if f.skipText > 0 {
			f.skipText--
			return nil
		}
		return []StreamResult{f.setAnswer(p.Text, false)}
	case omni.TypePartialText:
		if p.Role == omni.RoleUser {
			return nil
		}
		switch p.EventType {
		case omni.EventStart:
			f.streaming = true
			return []StreamResult{f.setAnswer(p.Text, false)}
		case omni.EventDelta:
			if p.Text == "" {
				return nil
			}
			if !f.streaming {
				f.streaming = true
				return []StreamResult{f.setAnswer(p.Text, false)}
			}
			return []StreamResult{f.setAnswer(p.Text, true)}
		case omni.EventStop:
			if f.streaming {
				f.streaming = false
				f.skipText++
				if p.Text != "" {
					return []StreamResult{f.setAnswer(p.Text, true)}
				}
			}
		}
	case omni.TypeApprovalDecision:
		n := len(f.pending)
		f.pending = slices.DeleteFunc(f.pending, func(a approval) bool { return a.id == p.ToolCallID })
		if len(f.pending) < n {
			u := f.status(f.nextState(), f.approvalMessage())
			data, _ := json.Marshal(map[string]string{"decision": p.Decision, "toolCallId": p.ToolCallID})
			f.task.History = append(f.task.History, Message{MessageID: "decision-" + p.ToolCallID, ContextID: f.task.ContextID,
				TaskID: f.task.ID, Role: RoleUser, Parts: []Part{{Data: data}}})
			return []StreamResult{u}
		}
	}
	return nil
}

// setAnswer replaces the answer with text, or appends text to it.
func (f *Folder) setAnswer(text string, appendText bool) StreamResult {
	if appendText {
		f.answer += text
	} else {
		f.answer = text
	}
	return StreamResult{ArtifactUpdate: &ArtifactUpdate{TaskID: f.task.ID, ContextID: f.task.ContextID,
		Artifact: Artifact{ArtifactID: AnswerArtifact, Name: AnswerArtifact, Parts: []Part{TextPart(text)}}, Append: appendText}}
}

func (f *Folder) server(data []byte) []StreamResult {
	var ev omni.ServerEvent
	if json.Unmarshal(data, &ev) != nil {
		return nil
	}
	switch ev.Type {
	case omni.ServerTaskState:
		if len(ev.Origin) > 0 || ev.TaskID != f.task.ID {
			return nil
		}
		switch {
		case !f.started && ev.State == omni.StateRunning:
			f.started = true
			return []StreamResult{f.status(StateWorking, nil)}
		case ev.State == omni.StateIdle: // also a Task cancelled while queued
			f.started, f.pending = true, nil
			switch ev.Status {
			case omni.StatusCompleted, "":
				return []StreamResult{f.status(StateCompleted, nil)}
			case omni.StatusAborted:
				return []StreamResult{f.status(StateCanceled, nil)}
			default:
				return []StreamResult{f.status(StateFailed, f.agentText("the task ended "+ev.Status))}
			}
		}
	case omni.ServerApprovalRequest:
		if !f.started {
			return nil
		}
		tc, err := omni.Decode(ev.ToolCall)
		if err != nil || tc.Payload.ToolCallID == "" {
			return nil
		}
		for _, a := range f.pending {
			if a.id == tc.Payload.ToolCallID {
				return nil
			}
		}
		f.pending = append(f.pending, approval{id: tc.Payload.ToolCallID, name: tc.Payload.Name, args: tc.Payload.Arguments})
		return []StreamResult{f.status(StateInputRequired, f.approvalMessage())}
	}
	return nil
}

func (f *Folder) nextState() string {
	if len(f.pending) > 0 {
		return StateInputRequired
	}
	return StateWorking
}

// approvalMessage asks for the oldest pending approval: a text and a data
// part {toolCallId, name, arguments}; nil when none is pending.
func (f *Folder) approvalMessage() *Message {
	if len(f.pending) == 0 {
		return nil
	}
	a := f.pending[0]
	data, _ := json.Marshal(map[string]string{"toolCallId": a.id, "name": a.name, "arguments": a.args})
	m := f.agentText(fmt.Sprintf("Approve the tool call %s (%s)? Answer with a message on this task: a data part {\"decision\": \"allow\"|\"deny\"}, or the text allow or deny.", a.name, a.id))
	m.MessageID = "approval-" + a.id
	m.Parts = append(m.Parts, Part{Data: data})
	return m
}

func (f *Folder) agentText(s string) *Message {
	return &Message{MessageID: "status-" + f.task.ID, ContextID: f.task.ContextID, TaskID: f.task.ID, Role: RoleAgent, Parts: []Part{TextPart(s)}}
}

// status moves the Task to state and returns its update. The timestamp is
// left out: a fold has no clock, and a replay must equal the live run.
func (f *Folder) status(state string, msg *Message) StreamResult {
	if prev := f.task.Status.Message; prev != nil && (msg == nil || prev.MessageID != msg.MessageID) {
		// A status message moves to the history when the status moves on,
		// so the Task keeps what it asked and said.
		f.task.History = append(f.task.History, *prev)
	}
	f.task.Status = Status{State: state, Message: msg}
	return StreamResult{StatusUpdate: &StatusUpdate{TaskID: f.task.ID, ContextID: f.task.ContextID, Status: f.task.Status}}
}
