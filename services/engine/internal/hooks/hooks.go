// Package hooks runs a deployment's hooks at the three points of the loop
// (protocol.md §7 "Hooks"): user_prompt (a Prompt or steering input before the
// model sees it), pre_tool_use (a committed tool call, before the command
// policy and the approval mode) and stop (the Task is about to end).
//
// A hook is a command (JSON on stdin, one JSON answer or nothing on
// stdout) or a NATS service answering requests on floe.hook.<point> (any
// language, any machine; replicas share a queue group of their choosing).
// Hooks at one point run in file order, one at a time. A hook that times
// out, exits non-zero, answers garbage or has no service counts as no
// opinion, recorded with reason "hook failed: …", unless it is required:
// then it denies (at stop: it stops). The first deny wins (at stop: the
// first continue with an input); later hooks still run and are recorded,
// as the original does.
//
// Runner is safe for concurrent use: each call runs its own processes and
// requests and returns when they are done.
package hooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/sandbox"
)

// Runner runs the hooks of one Config.
type Runner struct {
	cfg *Config
	nc  *nats.Conn
	sb  *sandbox.Sandbox
}

// New returns a Runner of cfg (nil: no hooks). nc carries the NATS hooks'
// requests (nil: a NATS hook fails as having no service). sb confines
// every hook command exactly as the toolrunner confines a tool
// (protocol.md §7 "Sandbox"); nil runs them unconfined, in the Workspace.
func New(cfg *Config, nc *nats.Conn, sb *sandbox.Sandbox) *Runner {
	if cfg == nil {
		cfg = &Config{}
	}
	if sb == nil {
		sb = unconfined
	}
	return &Runner{cfg: cfg, nc: nc, sb: sb}
}

// unconfined starts hook commands when New is given no sandbox.
var unconfined, _ = sandbox.New(sandbox.Config{Backend: sandbox.Off})

// Has reports whether a hook is configured at point.
func (r *Runner) Has(point string) bool { return r != nil && r.cfg.Has(point) }

// Outcome is what one point's hooks decided, and what to record.
type Outcome struct {
	// Records are the hook events of the hooks that answered or failed,
	// in run order. The Task publishes those of pre_tool_use and stop.
	Records []omni.HookRecord
	// Deny (user_prompt, pre_tool_use): the first deny, by hook By with
	// Reason.
	Deny   bool
	By     string
	Reason string
	// Context (user_prompt): each hook's context, in order.
	Context []string
	// Continue (stop): the first continue that carries an input, by By
	// with Reason; Input is the next input of the Task.
	Continue bool
	Input    string
}

// Run runs the hooks at in.Point (pre_tool_use: those whose match takes
// in.ToolName) and folds their answers. ctx ends the run early: a hook cut
// by it is recorded as failed and not honoured.
func (r *Runner) Run(ctx context.Context, in Input) Outcome {
	var out Outcome
	if r == nil {
		return out
	}
	body, err := in.MarshalJSON()
	if err != nil {
		// Only strings are marshalled; this cannot fail.
		panic("hooks: marshal input: " + err.Error())
	}
	for i := range r.cfg.Hooks[in.Point] {
		h := &r.cfg.Hooks[in.Point][i]
		if in.Point == omni.HookPreToolUse && !h.Matches(in.ToolName) {
			continue
		}
		a, err := r.runOne(ctx, h, in, body)
		if err != nil {
			a = &Answer{Reason: "hook failed: " + err.Error()}
			if h.Required {
				a.Decision = omni.DecisionDeny
				if in.Point == omni.HookStop {
					a.Decision = omni.DecisionStop
				}
			}
		}
		if a == nil {
			continue // no opinion, nothing to record
		}
		out.Records = append(out.Records, omni.HookRecord{
			Point: in.Point, Name: h.Name, Decision: a.Decision, Reason: a.Reason, Output: a.Output,
			ToolCallID: toolCallID(in),
		})
		switch {
		case a.Decision == omni.DecisionDeny && !out.Deny && in.Point != omni.HookStop:
			out.Deny, out.By, out.Reason = true, h.Name, a.Reason
		case a.Decision == omni.DecisionContinue && !out.Continue && a.Input != "":
			out.Continue, out.By, out.Reason, out.Input = true, h.Name, a.Reason, a.Input
		}
		if a.Context != "" {
			out.Context = append(out.Context, a.Context)
		}
	}
	return out
}

func toolCallID(in Input) string {
	if in.Point == omni.HookPreToolUse {
		return in.ToolCallID
	}
	return ""
}

// runOne runs one hook: its answer (nil: no opinion) or why it failed.
func (r *Runner) runOne(ctx context.Context, h *Hook, in Input, body []byte) (*Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, h.Timeout())
	defer cancel()
	var (
		b   []byte
		err error
	)
	if h.NATS {
		b, err = r.request(ctx, h, in.Point, body)
	} else {
		b, err = r.command(ctx, h, in, body)
	}
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("timed out after %s", h.Timeout())
		}
		return nil, err
	}
	return ParseAnswer(in.Point, b)
}

// stderrTail is how much of a failed command's stderr its reason keeps.
const stderrTail = 400

// command runs h's command with body on stdin and returns its stdout.
// Confined, it sees the system read-only, its Workspace read-write, a
// private /tmp and its own program, nothing else (no $FLOE_HOME, no
// credentials, no /proc of the engine), cannot reach Floe's ports, runs
// under the tools' limits, and every process it started is killed when
// it ends or times out (its PID namespace ends with it).
func (r *Runner) command(ctx context.Context, h *Hook, in Input, body []byte) ([]byte, error) {
	spec := sandbox.Spec{
		Argv: append([]string{h.Command}, h.Args...),
		Env:  append(hookEnv(), "FLOE_HOOK="+in.Point, "FLOE_SESSION_ID="+in.SessionID, "FLOE_TASK_ID="+in.TaskID),
		Read: programFiles(h.Command, h.Args),
	}
	if st, err := os.Stat(in.Workspace); err == nil && st.IsDir() {
		spec.Workspace = in.Workspace
	} else if r.sb.Backend() != sandbox.Off {
		spec.Dir = "/tmp" // the private one
	}
	p, err := r.sb.Command(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	cmd := p.Cmd
	cmd.Stdin = bytes.NewReader(append(body, '\n'))
	var stdout capped
	stdout.max = maxAnswer + 1
	var stderr tail
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A process that kept stdout open (unconfined: one that left the
	// process group) does not hold the hook past its end.
	cmd.WaitDelay = time.Second
	err = p.Start()
	if err != nil {
		return nil, err
	}
	err = cmd.Wait()
	if r.sb.Backend() == sandbox.Off {
		// The group's leftovers (a backgrounded child) end with the hook;
		// confined, the call's PID namespace is already gone.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	ex := p.Exit(err)
	var msg string
	switch {
	case ex.Limit != "":
		mem, pids := r.sb.Limits()
		msg = fmt.Sprintf("killed over the memory limit of %d MB (FLOE_TOOL_MEMORY_MB)", mem)
		if ex.Limit == "processes" {
			msg = fmt.Sprintf("killed over the process limit of %d (FLOE_TOOL_PIDS)", pids)
		}
	case ex.Error != "":
		msg = "sandbox: " + ex.Error
	case ex.Signal != "":
		msg = "signal: " + ex.Signal
	case ex.Code != 0:
		msg = fmt.Sprintf("exit status %d", ex.Code)
	}
	if msg != "" {
		if t := strings.TrimSpace(stderr.String()); t != "" {
			msg += ": " + t
		}
		return nil, errors.New(msg)
	}
	if stdout.over {
		return nil, fmt.Errorf("answer larger than %d bytes", maxAnswer)
	}
	return stdout.buf.Bytes(), nil
}

// programFiles are the files a confined hook must read besides the
// system's: its program (a path, or a name found in PATH) and the
// absolute paths among its arguments that are files (a script given to
// an interpreter). Only the files: their directories may hold what a hook
// must not see (FLOE_SANDBOX_READ opens more).
func programFiles(command string, args []string) []string {
	var files []string
	if p, err := exec.LookPath(command); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			files = append(files, abs)
		}
	}
	for _, a := range args {
		if filepath.IsAbs(a) {
			if fi, err := os.Stat(a); err == nil && fi.Mode().IsRegular() {
				files = append(files, a)
			}
		}
	}
	return files
}

// passedEnv are the variables of the engine's environment a hook command
// gets: what a program needs to run, never the engine's credentials (model
// keys, NATS passwords).
var passedEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM"}

func hookEnv() []string {
	var env []string
	for _, k := range passedEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// HeaderName carries the hook's name on a NATS hook request, for a
// service that answers several hooks at one point.
const HeaderName = "Floe-Hook-Name"

// request asks the NATS service of h and returns its answer.
func (r *Runner) request(ctx context.Context, h *Hook, point string, body []byte) ([]byte, error) {
	if r.nc == nil {
		return nil, errors.New("no NATS connection for a NATS hook")
	}
	m := nats.NewMsg(omni.HookSubject(point))
	m.Data = body
	m.Header.Set(HeaderName, h.Name)
	m.Header.Set("Content-Type", "application/json")
	reply, err := r.nc.RequestMsgWithContext(ctx, m)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("no service answers %s", m.Subject)
	}
	if err != nil {
		return nil, err
	}
	// A service built with nats.go's micro framework reports its errors
	// in headers.
	if e := reply.Header.Get("Nats-Service-Error"); e != "" {
		return nil, fmt.Errorf("service error: %s", e)
	}
	return reply.Data, nil
}

// capped keeps the first max bytes written and notes that more came.
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room < len(p) {
		c.over = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

// tail keeps the last stderrTail bytes written.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > stderrTail {
		t.b = append(t.b[:0], t.b[len(t.b)-stderrTail:]...)
	}
	return len(p), nil
}

func (t *tail) String() string { return string(t.b) }

var _ io.Writer = (*capped)(nil)
