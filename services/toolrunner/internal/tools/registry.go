package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"floe.dev/pkg/sandbox"
	"floe.dev/services/toolrunner/internal/argschema"
	"floe.dev/services/toolrunner/internal/pathlock"
)

// Defaults for the zero fields of Options.
const (
	DefaultMaxOutput  = 16000
	DefaultTimeout    = 120 * time.Second
	DefaultMaxTimeout = 10 * time.Minute
)

// Options tune Execute. A zero or negative field takes its default.
type Options struct {
	// MaxOutput is how many characters (runes) of a tool's output are kept,
	// from the head; the rest is replaced by a TruncationMarker. Default
	// DefaultMaxOutput.
	MaxOutput int
	// DefaultTimeout bounds a call that asks for no timeout. Default
	// DefaultTimeout.
	DefaultTimeout time.Duration
	// MaxTimeout caps the timeout_ms a call may ask for. Default
	// DefaultMaxTimeout.
	MaxTimeout time.Duration
	// Sandbox confines exec_command (nil: one made with sandbox.Auto).
	Sandbox *sandbox.Sandbox
	// Lock serializes write_file and edit_file on one resolved path: it
	// waits until the caller holds path's lock or ctx ends, and returns
	// the release. Default: a lock within this process; the toolrunner
	// gives one that holds across processes (pathlock.Locker).
	Lock LockFunc
}

// LockFunc takes a path's lock.
type LockFunc func(ctx context.Context, path string) (unlock func(), err error)

func (o Options) withDefaults() Options {
	if o.MaxOutput <= 0 {
		o.MaxOutput = DefaultMaxOutput
	}
	if o.DefaultTimeout <= 0 {
		o.DefaultTimeout = DefaultTimeout
	}
	if o.MaxTimeout <= 0 {
		o.MaxTimeout = DefaultMaxTimeout
	}
	return o
}

// errTimedOut is the cause of a call's context when its own timeout fires.
var errTimedOut = errors.New("tool call timed out")

// Registry is a fixed set of tools and the rules Execute applies to them. It
// is safe for concurrent use.
type Registry struct {
	opts   Options
	tools  []entry // in registration order
	byName map[string]int
}

type entry struct {
	tool       Tool
	spec       Spec
	args       *argschema.Schema
	timeoutArg bool // the tool takes an integer timeout_ms
}

// NewRegistry returns a registry of tools, in that order. Each tool's
// Parameters must be a JSON Schema of type object (compiled once, here, by
// package argschema); Execute validates arguments against it, a null
// top-level argument counting as absent. A tool declaring an integer
// timeout_ms property gets that many milliseconds as its timeout.
// NewRegistry panics on a nameless tool, a name used twice, a schema that
// does not compile or one requiring a field it does not declare: these are
// programming errors.
func NewRegistry(opts Options, tools ...Tool) *Registry {
	r := &Registry{opts: opts.withDefaults(), byName: map[string]int{}}
	for _, t := range tools {
		spec := t.Spec()
		if spec.Name == "" {
			panic("tools: tool without a name")
		}
		if _, dup := r.byName[spec.Name]; dup {
			panic(fmt.Sprintf("tools: tool %q registered twice", spec.Name))
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, spec.Parameters); err != nil {
			panic(fmt.Sprintf("tools: tool %q: parameters: %v", spec.Name, err))
		}
		spec.Parameters = compact.Bytes()
		s, err := argschema.Compile(spec.Parameters, argschema.Options{NullIsAbsent: true})
		if err != nil {
			panic(fmt.Sprintf("tools: tool %q: parameters: %v", spec.Name, err))
		}
		for _, name := range s.Required() {
			if !slices.Contains(s.Properties(), name) {
				panic(fmt.Sprintf("tools: tool %q: parameters require %q, which is not a property", spec.Name, name))
			}
		}
		r.byName[spec.Name] = len(r.tools)
		r.tools = append(r.tools, entry{tool: t, spec: spec, args: s, timeoutArg: s.Integer("timeout_ms")})
	}
	return r
}

// Builtin returns the built-in tools: exec_command, read_file, write_file
// and edit_file, in that order.
func Builtin(opts Options) *Registry {
	opts = opts.withDefaults()
	lock := opts.Lock
	if lock == nil {
		lock = new(pathlock.Local).Lock
	}
	return NewRegistry(opts, execCommand{opts: opts}, readFile{}, writeFile{lock: lock}, editFile{lock: lock})
}

// Specs returns the tools' specs in registration order, Parameters in
// compact JSON.
func (r *Registry) Specs() []Spec {
	specs := make([]Spec, len(r.tools))
	for i, e := range r.tools {
		specs[i] = e.spec
		specs[i].Parameters = bytes.Clone(e.spec.Parameters)
	}
	return specs
}

// Lookup returns the tool called name.
func (r *Registry) Lookup(name string) (Tool, bool) {
	i, ok := r.byName[name]
	if !ok {
		return nil, false
	}
	return r.tools[i].tool, true
}

// Execute runs one call and returns its complete Result, streaming the
// output to emit (which may be nil) as it is produced; the fragments,
// concatenated, equal Result.Output. It fails the call, without running
// anything, for an unknown tool or arguments that do not match the tool's
// schema. The call runs under ctx with a timeout: timeout_ms if the tool has
// it (capped at MaxTimeout), else DefaultTimeout; when either ends the call
// first, it fails with a TimeoutNote or "[canceled]". A panicking tool fails
// with "[tool panicked: …]". Execute never panics (unless emit does) and
// returns only after the tool has stopped emitting.
func (r *Registry) Execute(ctx context.Context, call Call, emit Emit) Result {
	out := newOutput(r.opts.MaxOutput, emit)
	i, ok := r.byName[call.Name]
	if !ok {
		msg := fmt.Sprintf("unknown tool %q; available: %s", call.Name, strings.Join(r.names(), ", "))
		return Result{Output: out.finish(msg), Failed: true}
	}
	e := r.tools[i]
	args, fields, err := e.args.Check(call.Arguments)
	if err != nil {
		msg := fmt.Sprintf("invalid arguments for %s: %v", call.Name, err)
		return Result{Output: out.finish(msg), Failed: true}
	}

	timeout := r.opts.DefaultTimeout
	if n, ok := fields["timeout_ms"].(json.Number); ok && e.timeoutArg {
		if ms, err := n.Int64(); err == nil && ms > 0 {
			timeout = r.opts.MaxTimeout
			if ms < r.opts.MaxTimeout.Milliseconds() {
				timeout = time.Duration(ms) * time.Millisecond
			}
		}
	}
	return r.execute(ctx, e.tool, call, args, timeout, out)
}

// Checked is a tool that validates its own arguments, such as an MCP tool
// (not registered: its server may change its list at any time).
type Checked interface {
	Tool
	// Check validates the raw arguments (empty means {}) and returns the
	// JSON object to run with, or an error saying what is wrong.
	Check(arguments string) (json.RawMessage, error)
	// Timeout bounds one call; zero takes the registry's DefaultTimeout.
	Timeout() time.Duration
}

// ExecuteChecked runs t, which is not registered, under the rules of
// Execute: arguments checked first, timeout, output cap, notes, panics
// recovered.
func (r *Registry) ExecuteChecked(ctx context.Context, t Checked, call Call, emit Emit) Result {
	out := newOutput(r.opts.MaxOutput, emit)
	args, err := t.Check(call.Arguments)
	if err != nil {
		msg := fmt.Sprintf("invalid arguments for %s: %v", call.Name, err)
		return Result{Output: out.finish(msg), Failed: true}
	}
	timeout := t.Timeout()
	if timeout <= 0 {
		timeout = r.opts.DefaultTimeout
	}
	return r.execute(ctx, t, call, args, min(timeout, r.opts.MaxTimeout), out)
}

// Names returns the registered tools' names in registration order.
func (r *Registry) Names() []string { return r.names() }

func (r *Registry) execute(ctx context.Context, t Tool, call Call, args json.RawMessage, timeout time.Duration, out *output) Result {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, errTimedOut)
	defer cancel()

	var res Result
	var notes []string
	if ctx.Err() == nil {
		var panicked bool
		res, panicked = runBounded(ctx, t, call, args, out.toolEmit)
		if panicked {
			notes = append(notes, res.Output)
			res = Result{Failed: true}
		}
	}
	if ctx.Err() != nil {
		res.Failed = true
		if cause := context.Cause(ctx); errors.Is(cause, errTimedOut) {
			notes = append(notes, TimeoutNote(timeout))
		} else {
			notes = append(notes, canceledNote(cause))
		}
	}
	return Result{Output: out.finish(res.Output, notes...), Failed: res.Failed || len(notes) > 0, Images: res.Images}
}

// abandonGrace is how long a call whose context ended may still take to
// return before Execute stops waiting for it (exec_command needs up to
// waitDelay to close its pipes).
const abandonGrace = 2 * waitDelay

// runBounded is run, but returns at most abandonGrace after ctx ends even
// if the tool does not (blocked in a system call that ignores ctx): its
// caller's slot is freed and the call is failed; the tool's late output is
// dropped (output is closed when Execute finishes) and its goroutine ends
// whenever the tool returns.
func runBounded(ctx context.Context, t Tool, call Call, args json.RawMessage, emit Emit) (Result, bool) {
	type outcome struct {
		res      Result
		panicked bool
	}
	done := make(chan outcome, 1)
	go func() {
		res, panicked := run(ctx, t, call, args, emit)
		done <- outcome{res, panicked}
	}()
	select {
	case o := <-done:
		return o.res, o.panicked
	case <-ctx.Done():
	}
	grace := time.NewTimer(abandonGrace)
	defer grace.Stop()
	select {
	case o := <-done:
		return o.res, o.panicked
	case <-grace.C:
		return Result{Failed: true}, false
	}
}

// run calls t.Run, turning a panic into panicked with the note in Output.
func run(ctx context.Context, t Tool, call Call, args json.RawMessage, emit Emit) (res Result, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			res, panicked = Result{Output: fmt.Sprintf("[tool panicked: %v]", p)}, true
		}
	}()
	return t.Run(ctx, call, args, emit), false
}

func (r *Registry) names() []string {
	names := make([]string, len(r.tools))
	for i, e := range r.tools {
		names[i] = e.spec.Name
	}
	return names
}
