package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"floe.dev/pkg/sandbox"
	"floe.dev/services/toolrunner/internal/toolenv"
)

// waitDelay is how long exec_command keeps reading after the command exits
// (or is killed) while something it started still holds the output open,
// such as a background process. Then the pipe is closed and the call ends.
const waitDelay = time.Second

// execCommand is exec_command: bash -lc in the Workspace.
type execCommand struct {
	opts Options // for the defaults shown in the schema
}

type execArgs struct {
	Description string `json:"description"`
	Cmd         string `json:"cmd"`
	Workdir     string `json:"workdir"`
	TimeoutMS   int64  `json:"timeout_ms"`
}

func (t execCommand) Spec() Spec {
	return Spec{
		Name: "exec_command",
		Description: fmt.Sprintf("Run a shell command with bash -lc in the workspace and return its "+
			"stdout and stderr, merged. A non-zero exit code is reported on a last line "+
			"\"[exit code: N]\". Output beyond %d characters is cut. When the timeout "+
			"expires the command and every process it started are killed.", t.opts.MaxOutput),
		Parameters: json.RawMessage(fmt.Sprintf(`{
  "type": "object",
  "properties": {
    "description": {"type": "string", "description": "What the command does and why, in a few words."},
    "cmd": {"type": "string", "description": "The command line, run with bash -lc."},
    "workdir": {"type": "string", "description": "Directory to run in, absolute or relative to the workspace, and inside it. Default: the workspace."},
    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Timeout in milliseconds. Default %d, at most %d."}
  },
  "required": ["description", "cmd"],
  "additionalProperties": false
}`, t.opts.DefaultTimeout.Milliseconds(), t.opts.MaxTimeout.Milliseconds())),
		Permission: PermReadWrite,
	}
}

// Run starts bash in its own process group and streams its merged output.
// When ctx ends, the whole group is killed and Run returns a failed Result
// with no note: Execute adds the timeout or cancel note.
func (t execCommand) Run(ctx context.Context, call Call, args json.RawMessage, emit Emit) Result {
	var a execArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return failed(fmt.Sprintf("invalid arguments: %v", err))
	}
	ws, err := openWorkspace(call.Workspace)
	if err != nil {
		return failed(err.Error())
	}
	dir, env := ws.real, []string{"PWD=" + ws.real}
	if a.Workdir != "" {
		shown, real, err := ws.resolve(a.Workdir)
		if err != nil {
			return failed(err.Error())
		}
		// The directory is opened through the workspace's root and the
		// command starts in it by its descriptor (/proc/self/fd/N, which the
		// child still holds when it changes directory): a component swapped
		// for a link to outside after the check cannot move it.
		d, err := openDir(ws, real)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return failed(fmt.Sprintf("workdir %s does not exist", shown))
		case errors.Is(err, errNotDir):
			return failed(fmt.Sprintf("workdir %s is not a directory", shown))
		case err != nil:
			return failed(fmt.Sprintf("workdir %s: %v", shown, unwrapPath(err)))
		}
		defer d.Close()
		// No PWD: the shell asks the kernel where it is (a PWD naming the
		// path could, after a swap, name a link to outside).
		dir, env = fmt.Sprintf("/proc/self/fd/%d", d.Fd()), nil
	}

	sb := t.opts.Sandbox
	if sb == nil {
		sb = defaultSandbox()
	}
	spec := sandbox.Spec{Argv: []string{"bash", "-lc", a.Cmd}, Env: toolenv.Environ(append(env, call.Env...)...), Workspace: ws.real, Dir: dir}
	if sb.Backend() != sandbox.Off && a.Workdir != "" {
		// Confined, the directory is named by its path (the call sees
		// nothing outside its Workspace to swap a component for).
		_, real, _ := ws.resolve(a.Workdir)
		spec.Dir, spec.Env = real, toolenv.Environ(append([]string{"PWD=" + real}, call.Env...)...)
	}
	p, err := sb.Command(ctx, spec)
	if err != nil {
		return failed(fmt.Sprintf("start bash: %v", err))
	}
	defer p.Close()
	cmd := p.Cmd
	// Stdout and Stderr are the same comparable writer, so the command gets
	// one pipe for both and its output keeps the order it was written in.
	w := &emitWriter{emit: emit}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.WaitDelay = waitDelay

	err = p.Run()
	ex := p.Exit(err)
	if ex.Limit != "" {
		return failed(limitNote(ex.Limit, sb))
	}
	if ctx.Err() != nil {
		return Result{Failed: true}
	}
	switch {
	case ex.Error != "":
		return failed(fmt.Sprintf("run bash: %s", ex.Error))
	case ex.Signal != "":
		return failed(signalNote(ex.Signal))
	case ex.Code != 0:
		return failed(ExitCodeNote(ex.Code))
	}
	return Result{}
}

// defaultSandbox confines commands when Options has no Sandbox: the
// strongest backend the host has (sandbox.Auto), as the toolrunner's
// default, made once (until closeDefaultSandbox).
func defaultSandbox() *sandbox.Sandbox {
	defaultSB.Lock()
	defer defaultSB.Unlock()
	if defaultSB.sb == nil {
		sb, err := sandbox.New(sandbox.Config{Backend: sandbox.Auto})
		if err != nil { // Auto does not fail; should it, stay closed
			panic(fmt.Sprintf("tools: default sandbox: %v", err))
		}
		defaultSB.sb = sb
	}
	return defaultSB.sb
}

var defaultSB struct {
	sync.Mutex
	sb *sandbox.Sandbox
}

// closeDefaultSandbox closes the default sandbox, if one was made, and
// stops its goroutines (the tests' end; the toolrunner always passes its
// own Sandbox).
func closeDefaultSandbox() {
	defaultSB.Lock()
	defer defaultSB.Unlock()
	if defaultSB.sb != nil {
		defaultSB.sb.Close()
		defaultSB.sb = nil
	}
}

// limitNote is the output of a call killed for exceeding a limit.
func limitNote(limit string, sb *sandbox.Sandbox) string {
	mem, pids := sb.Limits()
	switch limit {
	case "memory":
		return fmt.Sprintf("[memory limit exceeded: the command used more than %d MB (FLOE_TOOL_MEMORY_MB) and was killed]", mem)
	case "processes":
		return fmt.Sprintf("[process limit exceeded: the command ran more than %d processes (FLOE_TOOL_PIDS) and was killed]", pids)
	}
	return "[" + limit + " limit exceeded: the command was killed]"
}

// errNotDir marks a workdir that is not a directory.
var errNotDir = errors.New("not a directory")

// openDir opens the directory real (a path ws.resolve returned) through
// the workspace's root.
func openDir(ws workspace, real string) (*os.File, error) {
	root, err := ws.root()
	if err != nil {
		return nil, err
	}
	defer root.Close()
	rel := ws.rel(real)
	if fi, err := root.Stat(rel); err == nil && !fi.IsDir() {
		return nil, errNotDir
	}
	d, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if errors.Is(err, syscall.ENOTDIR) {
		return nil, errNotDir
	}
	return d, err
}

// emitWriter passes each chunk the command writes to emit as it arrives. It
// never fails, so the pipe is always drained; capping is Execute's job.
type emitWriter struct {
	emit Emit
}

func (w *emitWriter) Write(p []byte) (int, error) {
	w.emit(string(p))
	return len(p), nil
}
