package omni

import "encoding/json"

// ServerEvent is a gateway-facing event published on floe.session.<sid>.server
// and sent on SSE as `event: server_event` (protocol.md §4).
type ServerEvent struct {
	Type string `json:"type"`
	// task_state
	State string `json:"state,omitempty"`
	// Status is the outcome of the Task that just ended (task_state idle).
	Status string `json:"status,omitempty"`
	// TaskID names the Task a task_state belongs to.
	TaskID string `json:"taskId,omitempty"`
	// Reason says why a Task ended failed without running (task_state
	// idle of a Task the engines could not start), for the user to see.
	Reason string `json:"reason,omitempty"`
	// approval_request
	ToolCall json.RawMessage `json:"toolCall,omitempty"`
	Origin   []string        `json:"origin,omitempty"`
}

// Server event types and task states.
const (
	ServerTaskState       = "task_state"
	ServerApprovalRequest = "approval_request"
	ServerResyncRequired  = "resync_required"

	StateIdle       = "idle"
	StateRunning    = "running"
	StateCompacting = "compacting"
)

// Wire error codes (append-only; never renumber or reuse).
const (
	CodeUnauthorized     = "unauthorized"
	CodeNotFound         = "not_found"
	CodeBadRequest       = "bad_request"
	CodeUnsupportedMedia = "unsupported_media_type"
	CodeTooLarge         = "body_too_large"
	CodeTaskInProgress   = "task_in_progress"
	CodeCompacting       = "compacting"
	CodeNotRunning       = "not_running"
	CodeNothingToCompact = "nothing_to_compact"
	CodeInternal         = "internal"
	CodeUnavailable      = "unavailable"
	CodeRequestTimeout   = "request_timeout" // the request body did not arrive in time
	CodeTraceExists      = "trace_session_exists"
	CodeExpired          = "expired"           // what was asked for left the stream's retention
	CodeForbidden        = "forbidden"         // a Host, Origin or Sec-Fetch-Site the gateway refuses
	CodeRateLimited      = "rate_limited"      // too many attempts or requests at once: retry after Retry-After
	CodeModelUnavailable = "model_unavailable" // the model's provider is not configured here (its key is missing)
)
