package tools

import (
	"context"
	"encoding/json"
)

// Permissions a Spec may ask for; the approval policy decides on them.
const (
	PermRead      = "r"  // reads the Workspace only
	PermReadWrite = "rw" // may change the Workspace or run commands
)

// Spec describes a tool to the model and to the approval policy.
type Spec struct {
	Name        string
	Description string
	// Parameters is a JSON Schema of type object (the built-ins declare
	// properties, required, additionalProperties false). Execute validates
	// arguments against it (see NewRegistry).
	Parameters json.RawMessage
	Permission string // PermRead or PermReadWrite
}

// Call is one invocation of a tool.
type Call struct {
	Name string
	// Arguments is the raw JSON text the model produced; it may be invalid.
	// Empty means {}.
	Arguments string
	// Workspace is the absolute path of the Session's Workspace; tools may
	// not reach outside it.
	Workspace string
	// Env is extra environment for commands, such as FLOE_SESSION_ID=…
	// and FLOE_TOOL_CALL_ID=…; it is added after the allow-listed part of
	// the process environment (toolenv.Environ) and wins over it.
	Env []string
}

// Result is the complete outcome of a call. Failed means the tool failed
// (stop_reason "failed"); the reason is in Output. A tool error is a Result,
// never a panic or a Go error.
type Result struct {
	Output string
	Failed bool
	// Images are data URLs (data:<mime>;base64,…) the tool returned
	// besides its text, passed to the model as the output's images.
	Images []string
}

// Emit receives output fragments in order as they are produced. Execute
// calls it one fragment at a time, possibly from a goroutine other than its
// caller's, never after Execute returns and never with an empty fragment;
// every fragment is valid UTF-8. It must not panic and should return soon:
// the tool waits for it.
type Emit func(fragment string)

// Tool is one tool. Implementations are called through Registry.Execute,
// which validates arguments, caps output and recovers panics; Run is not
// meant to be called directly.
type Tool interface {
	// Spec describes the tool. Execute reads it once, in NewRegistry.
	Spec() Spec
	// Run executes one call. args is the validated JSON object (never
	// empty). Run streams its output through emit as it is produced and
	// returns the outcome: the returned Output is appended after everything
	// emitted, on its own line, so a streaming tool returns only a closing
	// note (an exit code) and a non-streaming tool returns all its text
	// there. Both parts are capped separately, so a closing note survives
	// the truncation of a long stream. Run must stop promptly when ctx ends
	// and must not call emit after it returns (such calls are dropped).
	Run(ctx context.Context, call Call, args json.RawMessage, emit Emit) Result
}

// failed returns a failed Result with output msg.
func failed(msg string) Result { return Result{Output: msg, Failed: true} }
