package omni

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

// Internal payloads travel between services on non-public subjects, encoded
// with msgpack (Content-Type application/msgpack). They are plain data.

// ContentTypeMsgpack is the Content-Type header of internal payloads.
const ContentTypeMsgpack = "application/msgpack"

// Internal streams, buckets and subjects.
const (
	// TasksStream is the work queue of Tasks: floe.task.<sid>.
	TasksStream = "FLOE_TASKS"
	// ToolsStream is the work queue of tool jobs: floe.tool.<pool>.<sid>.
	ToolsStream = "FLOE_TOOLS"
	// SessionsBucket is the KV bucket of Session records, keyed by Session id.
	SessionsBucket = "floe_sessions"
	// SnapshotsBucket is the KV bucket of context snapshots, keyed by
	// Session id: an engine's folded model context of the Session with the
	// stream sequence it covers (msgpack, versioned; see the engine's
	// snapshot package and docs/history-window.md).
	SnapshotsBucket = "floe_snapshots"
	// SignInsBucket is the KV bucket of browser sign-ins, keyed by the
	// SHA-256 (hex) of the sign-in cookie: the gateway's own records, each
	// kept at most SignInTTL (the bucket's max age).
	SignInsBucket = "floe_signins"
	// ProtocolsBucket is the KV bucket of the standard protocols' bindings
	// (AG-UI threads and runs, A2A tasks) to Sessions and Tasks: JSON
	// values, written by the gateway.
	ProtocolsBucket = "floe_protocols"
	// LocksBucket is the KV bucket of the toolrunners' per-path file
	// locks (protocol.md §7): a key per resolved path, created with a lease (a
	// per-key TTL) by the runner editing it and deleted when done.
	LocksBucket = "floe_locks"
	// DefaultPool is the runner pool tool jobs go to unless routed elsewhere.
	DefaultPool = "default"
)

// TaskSubject returns floe.task.<sid>.
func TaskSubject(sessionID string) string { return "floe.task." + sessionID }

// ToolSubject returns floe.tool.<pool>.<sid>.
func ToolSubject(pool, sessionID string) string { return "floe.tool." + pool + "." + sessionID }

// HeartbeatSubject returns floe.hb.<sid>: tool runners report running jobs there.
func HeartbeatSubject(sessionID string) string { return "floe.hb." + sessionID }

// ToolListSubject returns floe.toollist.<pool>: a runner of the pool
// answers with its tools (msgpack []ToolSpec).
func ToolListSubject(pool string) string { return "floe.toollist." + pool }

// CancelSubject returns floe.cancel.<sid>: the engine asks every runner to
// stop the Session's jobs (request; each runner that stopped any replies).
func CancelSubject(sessionID string) string { return "floe.cancel." + sessionID }

// ControlSubject returns floe.ctl.<sid>.<verb>, served by the engine that owns
// the Session's running Task.
func ControlSubject(sessionID, verb string) string { return "floe.ctl." + sessionID + "." + verb }

// TraceDeleteSubject returns floe.tracer.delete.<sid>: the gateway asks the
// tracer (the only writer and deleter of Trace files) to delete the
// Session's Trace files and position (request TraceDelete, reply
// TraceDeleteReply).
func TraceDeleteSubject(sessionID string) string { return "floe.tracer.delete." + sessionID }

// TraceDelete asks the tracer to delete a Session's Trace. With Purge the
// tracer first purges the Session's messages from FLOE_SESSIONS (the
// gateway, which serves HTTP, may not purge the stream) and takes the
// stream's last sequence after it as PurgedThrough. Without it the
// messages are already purged and PurgedThrough is the stream's last
// sequence after that purge. Records of the Session at or below
// PurgedThrough that the tracer still receives are dropped, never
// written again.
type TraceDelete struct {
	PurgedThrough uint64 `msgpack:"purged_through"`
	Purge         bool   `msgpack:"purge,omitempty"`
}

// TraceDeleteReply answers TraceDelete: the Trace files removed, or an error.
type TraceDeleteReply struct {
	Files int    `msgpack:"files"`
	Error string `msgpack:"error,omitempty"`
}

// Control verbs.
const (
	CtlApprove  = "approve"
	CtlAbort    = "abort"
	CtlSteer    = "steer"
	CtlRetryNow = "retry_now"
	CtlPending  = "pending"
)

// Task kinds.
const (
	TaskRun     = "run"
	TaskCompact = "compact"
)

// InputPart is one part of a Task's user input.
type InputPart struct {
	Type     string `msgpack:"type" json:"type"` // "text" or "image_url"
	Text     string `msgpack:"text,omitempty" json:"text,omitempty"`
	ImageURL string `msgpack:"image_url,omitempty" json:"imageUrl,omitempty"`
}

// Task asks an engine to run one Task (or a manual compaction) of a Session.
type Task struct {
	ID            string      `msgpack:"id"`
	Kind          string      `msgpack:"kind"`
	SessionID     string      `msgpack:"session_id"`
	Input         []InputPart `msgpack:"input"`
	ThinkingLevel string      `msgpack:"thinking_level,omitempty"`
	// ParentSessionID and ParentToolCallID are set for a subagent's Task.
	ParentSessionID  string `msgpack:"parent_session_id,omitempty"`
	ParentToolCallID string `msgpack:"parent_tool_call_id,omitempty"`
}

// ToolJob asks a tool runner to execute one approved tool call.
type ToolJob struct {
	SessionID  string `msgpack:"session_id"`
	ToolCallID string `msgpack:"tool_call_id"`
	Name       string `msgpack:"name"`
	Arguments  string `msgpack:"arguments"`
	Workspace  string `msgpack:"workspace"`
	// Origin is prepended to nothing: runners publish on the Session's own
	// subjects; forwarding to a parent is the engine's job.
	EnqueuedUnixMs int64 `msgpack:"enqueued_unix_ms"`
	// BeatToken is a secret of this job (an HMAC of the call id under the
	// Session record's BeatKey): only a runner that pulled the job knows
	// it, and the engine counts a heartbeat for the call only with it
	// (NATS permissions cannot tell which runner holds which job).
	BeatToken string `msgpack:"beat_token,omitempty"`
}

// Heartbeat reports the jobs a runner is executing for one Session.
// Tokens[i] is the BeatToken of the job of ToolCallIDs[i].
type Heartbeat struct {
	Runner      string   `msgpack:"runner"`
	ToolCallIDs []string `msgpack:"tool_call_ids"`
	Tokens      []string `msgpack:"tokens,omitempty"`
}

// Cancel asks runners to stop jobs of a Session (all when ToolCallIDs is empty).
type Cancel struct {
	ToolCallIDs []string `msgpack:"tool_call_ids"`
}

// CancelReply lists the jobs one runner stopped; it is sent only after those
// jobs can publish nothing more.
type CancelReply struct {
	Runner      string   `msgpack:"runner"`
	ToolCallIDs []string `msgpack:"tool_call_ids"`
}

// Control is a request to the engine owning a Session's Task.
type Control struct {
	ToolCallID string `msgpack:"tool_call_id,omitempty"`
	Decision   string `msgpack:"decision,omitempty"`
	Text       string `msgpack:"text,omitempty"`
	// Scope of an approve: "" for the one call, ScopeSession to allow
	// the call's tool for the rest of the Session.
	Scope string `msgpack:"scope,omitempty"`
}

// ScopeSession is the Control.Scope of an allow that also allows the
// call's tool for the rest of the Session (SessionRecord.AllowedTools).
const ScopeSession = "session"

// ControlReply answers a Control request.
type ControlReply struct {
	OK      bool   `msgpack:"ok"`
	Code    string `msgpack:"code,omitempty"`
	Message string `msgpack:"message,omitempty"`
	Skipped bool   `msgpack:"skipped,omitempty"`
	// Pending lists pending approval requests (verb pending).
	Pending [][]byte `msgpack:"pending,omitempty"`
}

// Pack encodes an internal payload with msgpack.
func Pack(v any) ([]byte, error) {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("omni: pack %T: %w", v, err)
	}
	return b, nil
}

// Unpack decodes an internal payload; a clear error on anything malformed.
func Unpack(b []byte, v any) error {
	if err := msgpack.Unmarshal(b, v); err != nil {
		return fmt.Errorf("omni: unpack %T: %w", v, err)
	}
	return nil
}

// Approval modes.
const (
	ApproveAllowAll  = "allow-all"
	ApproveDenyAll   = "deny-all"
	ApproveReadOnly  = "read-only"
	ApproveAlwaysAsk = "always-ask"
)

// ValidApprovalMode reports whether m is one of the approval modes.
func ValidApprovalMode(m string) bool {
	switch m {
	case ApproveAllowAll, ApproveDenyAll, ApproveReadOnly, ApproveAlwaysAsk:
		return true
	}
	return false
}

// CompactionConfig sets when and how a Session compacts.
type CompactionConfig struct {
	MaxContextLength int64  `msgpack:"max_context_length,omitempty" json:"maxContextLength,omitempty"`
	MaxSessionTurns  int64  `msgpack:"max_session_turns,omitempty" json:"maxSessionTurns,omitempty"`
	Mode             string `msgpack:"mode,omitempty" json:"mode,omitempty"`
}

// SessionRecord is a Session's entry in the SessionsBucket KV bucket. State
// moves idle→running/compacting only by compare-and-set, so one Task runs per
// Session across every gateway and engine replica.
type SessionRecord struct {
	ID           string `msgpack:"id"`
	Model        string `msgpack:"model"`
	Workspace    string `msgpack:"workspace"`
	ApprovalMode string `msgpack:"approval_mode"`
	SystemPrompt string `msgpack:"system_prompt,omitempty"`
	// Instructions is the Workspace's AGENTS.md, read when the Session was
	// created; the engine appends it to the system prompt.
	Instructions string           `msgpack:"instructions,omitempty"`
	MaxTurns     int              `msgpack:"max_turns,omitempty"`
	Compaction   CompactionConfig `msgpack:"compaction"`
	Title        string           `msgpack:"title,omitempty"`
	// TitleSource says where Title came from: TitleFromPrompt (the first
	// Task's text, set by the gateway), TitleFromModel (a short title the
	// engine asked the model for after the first Task), or "" (given by a
	// person, never replaced).
	TitleSource   string `msgpack:"title_source,omitempty"`
	Principal     string `msgpack:"principal,omitempty"`
	CreatedUnixMs int64  `msgpack:"created_unix_ms"`
	// State is idle, running or compacting; TaskID the Task that holds it.
	State  string `msgpack:"state"`
	TaskID string `msgpack:"task_id,omitempty"`
	// Lease names the engine delivery running TaskID; an engine that finds
	// another lease there has lost the Task (it stalled past its ack wait
	// and the Task was redelivered) and must stop publishing.
	Lease string `msgpack:"lease,omitempty"`
	// LastStatus is the outcome of the last Task (completed, failed, aborted).
	LastStatus string `msgpack:"last_status,omitempty"`
	// Released is "<task id>/<lease>" of the engine delivery that last
	// moved the Session from its Task back to idle ("" when something
	// else ended it: Sessions.End). A release whose answer was lost
	// recognises its own write when retried, and when the engine died
	// between the release and the Task's task_state idle, the Task's
	// redelivery or the next Task's engine publishes that end.
	Released string `msgpack:"released,omitempty"`
	// ReleasedUnixMs is when Released was written: the next Task's engine
	// publishes a missing end of the Task released just before it (a
	// Nats-Msg-Id keeps it once) only within a short window of it.
	ReleasedUnixMs int64 `msgpack:"released_unix_ms,omitempty"`
	// BeatKey is the Session's secret for its tool jobs' BeatTokens (an
	// HMAC of the call id): an engine that resumes a call after another
	// engine died knows the token a heartbeat must carry. Engines only: the
	// toolrunner's role cannot read the bucket, and no view shows it.
	BeatKey string `msgpack:"beat_key,omitempty"`
	// Parent is the parent Session of a subagent; Depth its nesting depth.
	Parent string `msgpack:"parent,omitempty"`
	Depth  int    `msgpack:"depth,omitempty"`
	// Deleted marks a Session being deleted.
	Deleted bool `msgpack:"deleted,omitempty"`
	// CarryOver holds model-context-only user texts for the next run (an
	// interrupted turn flattened into a [turn_aborted] block); never
	// streamed, never in the Trace.
	CarryOver []CarryItem `msgpack:"carry_over,omitempty"`
	// CommandPolicy is the deployment's command policy as it was when the
	// Session was created (protocol.md §7); nil on records that predate it, which
	// get the factory set.
	CommandPolicy *CommandPolicy `msgpack:"command_policy,omitempty"`
	// CommandPolicyRef names the stored copy of CommandPolicy: the record
	// store (bus.Sessions) keeps a policy once per bucket under a key of
	// its digest and writes only the digest into the record, which it
	// rewrites several times a Task; it fills CommandPolicy back in when
	// it reads the record. Records written before hold CommandPolicy
	// itself.
	CommandPolicyRef string `msgpack:"command_policy_ref,omitempty"`
	// ForkedFrom is where a forked Session was cut from its parent (nil
	// for any other Session).
	ForkedFrom *ForkedFrom `msgpack:"forked_from,omitempty"`
	// AllowedTools are the tools a person allowed for the rest of the
	// Session at an approval prompt (an allow with ScopeSession): where
	// the approval mode would ask, the engine allows their calls without
	// asking, whichever client runs the next Task. The command policy
	// still applies, and deny-all still denies.
	AllowedTools []string `msgpack:"allowed_tools,omitempty"`
	// PurgedThrough is the last FLOE_SESSIONS sequence of the Session
	// that the engine removed from the stream once the Session had been
	// idle FLOE_IDLE_KEEP and the tracer had written it (0: none): every
	// message of the Session at or below it is read from the Trace only.
	// It is written before the purge, so it may name messages still
	// held, never a gap it does not name. An SSE client whose
	// Last-Event-ID is below it gets resync_required (protocol.md §4).
	PurgedThrough uint64 `msgpack:"purged_through,omitempty"`
}

// Title sources of a SessionRecord.
const (
	TitleFromPrompt = "prompt"
	TitleFromModel  = "model"
)

// CommandPolicy is an ordered list of deny rules matched against the
// normalized cmd of exec_command before any approval mode is consulted
// (package omni/cmdpolicy compiles and matches it). Source says where it
// came from: "factory", "off" (no rules) or the rules file's path.
type CommandPolicy struct {
	Source string        `msgpack:"source" json:"source"`
	Rules  []CommandRule `msgpack:"rules" json:"rules"`
}

// CommandRule is one deny rule; Pattern is RE2. A rule with Enabled set to
// false is kept but never matches.
type CommandRule struct {
	Name        string `msgpack:"name" json:"name"`
	Pattern     string `msgpack:"pattern" json:"pattern"`
	Description string `msgpack:"description,omitempty" json:"description,omitempty"`
	Enabled     *bool  `msgpack:"enabled,omitempty" json:"enabled,omitempty"`
}

// CarryItem is model-context-only text inserted before the At-th message of
// the folded context.
type CarryItem struct {
	At   int    `msgpack:"at"`
	Text string `msgpack:"text"`
}

// promptTitleLen bounds a title taken from a prompt, in runes: what fits
// on a session list row.
const promptTitleLen = 60

// PromptTitle is the title a Session gets from the text of its first Task
// at once (the engine may later replace it with a shorter one from the
// model): the first non-blank line, spaces collapsed, control characters
// dropped, cut with ClipTitle near 60 runes. "" when the text has no
// visible characters. The gateway's Tasks and `floe run` both title this
// way.
func PromptTitle(text string) string {
	var line string
	for l := range strings.Lines(text) {
		if f := strings.Fields(l); len(f) > 0 {
			line = strings.Join(f, " ")
			break
		}
	}
	line = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, line)
	return ClipTitle(line, promptTitleLen)
}

// ClipTitle cuts a Session title longer than max runes at a word boundary
// in its second half, drops the punctuation left at the cut and ends it
// with an ellipsis; a title of at most max runes is returned as it is.
// The gateway's prompt titles and the engine's model titles both end here.
func ClipTitle(t string, max int) string {
	if utf8.RuneCountInString(t) <= max {
		return t
	}
	cut := string([]rune(t)[:max])
	if i := strings.LastIndexByte(cut, ' '); i > max/2 {
		cut = cut[:i]
	}
	return strings.TrimRight(cut, " .,;:") + "…"
}
