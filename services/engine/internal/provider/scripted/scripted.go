package scripted

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// ProviderName is the provider part of a scripted model reference.
const ProviderName = "scripted"

// DemoName is the model id of the built-in demo model.
const DemoName = "demo"

// Provider is a scripted model, made by Open, Load, Parse or Demo (the zero
// value is not usable). It is safe for concurrent use: Sessions stream
// independently, each through its own counter.
type Provider struct {
	name          string
	contextWindow int64
	script        *script                     // nil for a planned model (the demo)
	plan          func(*model.Request) *entry // decides each request when script is nil

	mu         sync.Mutex
	sessions   map[string]*session // by Request.SessionID; mu must be held
	mismatches []error             // mu must be held
}

// session is what a Provider remembers about one Session.
type session struct {
	calls int               // Stream calls so far
	ids   model.IDAllocator // used when Request.IDs is nil
}

var _ model.Provider = (*Provider)(nil)

// Open returns the model "scripted:<nameOrPath>": the demo model for
// "demo", otherwise the script file at path nameOrPath.
func Open(nameOrPath string) (*Provider, error) {
	switch nameOrPath {
	case DemoName:
		return Demo(), nil
	case "":
		return nil, errors.New("scripted model: empty name; use scripted:demo or scripted:<path to a script file>")
	}
	return Load(nameOrPath)
}

// MaxScriptSize caps a script file: a larger one is refused before it is
// read.
const MaxScriptSize = 4 << 20

// ErrNotRegular is returned by Load for a path that is not a regular file
// (a FIFO, a device such as /dev/zero, a socket, a directory).
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is returned by Load for a file over MaxScriptSize.
var ErrTooLarge = fmt.Errorf("larger than %d bytes", MaxScriptSize)

// Load reads and validates the script file at path. The model id is path.
// A path that is not a regular file is refused with ErrNotRegular, one over
// MaxScriptSize with ErrTooLarge, both before anything is read (a FIFO
// never blocks, /dev/zero is never read). A malformed script is a
// *ScriptError naming the file, line and field; no error quotes the file's
// contents.
func Load(path string) (*Provider, error) {
	data, err := readScript(path)
	if err != nil {
		return nil, fmt.Errorf("load scripted model %q: %w", path, err)
	}
	return Parse(path, data)
}

func readScript(path string) ([]byte, error) {
	check := func(fi os.FileInfo) error {
		switch {
		case !fi.Mode().IsRegular():
			return ErrNotRegular
		case fi.Size() > MaxScriptSize:
			return ErrTooLarge
		}
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := check(fi); err != nil {
		return nil, err
	}
	// O_NONBLOCK: should path be swapped for a FIFO after the Stat, opening
	// it does not wait for a writer; the Stat of the open file decides.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := check(fi); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxScriptSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxScriptSize {
		return nil, ErrTooLarge
	}
	return data, nil
}

// Parse validates the script in data; name is the model id and prefixes
// error messages. A malformed script is a *ScriptError.
func Parse(name string, data []byte) (*Provider, error) {
	s, err := parseScript(name, data)
	if err != nil {
		return nil, err
	}
	return &Provider{name: name, contextWindow: s.contextWindow, script: s}, nil
}

// Info describes the model for session_meta.
func (p *Provider) Info() model.Info {
	return model.Info{Provider: ProviderName, ModelID: p.name, ContextWindow: p.contextWindow}
}

// Calls returns how many Stream calls the Session has made so far.
func (p *Provider) Calls(sessionID string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.sessions[sessionID]; s != nil {
		return s.calls
	}
	return 0
}

// Mismatches returns the failures of expect_last_user and
// expect_tool_outputs so far, in the order they happened, so a test can
// assert the model was fed what it expected even when the engine retried.
func (p *Provider) Mismatches() []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]error(nil), p.mismatches...)
}

// begin counts one call of the Session and returns its 1-based number and
// the Session's fallback id allocator.
func (p *Provider) begin(sessionID string) (int, *model.IDAllocator) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sessions == nil {
		p.sessions = make(map[string]*session)
	}
	s := p.sessions[sessionID]
	if s == nil {
		s = &session{}
		p.sessions[sessionID] = s
	}
	s.calls++
	return s.calls, &s.ids
}

// Stream plays the Session's next scripted request; see the package
// documentation. It returns a *model.Error for a scripted failure, an
// exhausted script or a failed expect_* matcher, ctx.Err() when ctx ends,
// and emit's error when emit fails.
func (p *Provider) Stream(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	if req.Purpose == model.PurposeTitle {
		return p.title(ctx, req, emit)
	}
	n, fallbackIDs := p.begin(req.SessionID)
	ids := req.IDs
	if ids == nil {
		ids = fallbackIDs
	}
	e, err := p.entryFor(req, n)
	if err == nil {
		err = p.check(e, req, n)
	}
	if err != nil {
		return model.Result{Usage: estimate(req, 0), StopReason: model.StatusOf(err)}, err
	}

	pl := &player{emit: emit, ids: ids}
	err = pl.play(ctx, e.steps)
	usage := estimate(req, pl.outChars)
	if e.usage != nil {
		usage = *e.usage
	}
	if err != nil {
		return model.Result{Usage: usage, StopReason: model.StatusOf(err)}, err
	}
	return model.Result{Usage: usage, StopReason: e.stopReason}, nil
}

// entryFor returns what the n-th call of a Session plays.
func (p *Provider) entryFor(req *model.Request, n int) (*entry, error) {
	if p.script == nil {
		return p.plan(req), nil
	}
	s := p.script
	if n <= len(s.requests) {
		return s.requests[n-1], nil
	}
	switch s.afterLast {
	case afterRepeatLast:
		return s.requests[len(s.requests)-1], nil
	case afterFinalText:
		return &entry{steps: []step{{kind: stepText, content: s.finalText}}, stopReason: omni.StatusCompleted}, nil
	}
	return nil, &model.Error{Status: omni.StatusFailed,
		Message: fmt.Sprintf("%s: script exhausted after %d requests", p.name, len(s.requests))}
}

// check runs the entry's expect_* matchers against the request.
func (p *Provider) check(e *entry, req *model.Request, n int) error {
	var problem string
	if want := e.expectLastUser; want != nil {
		last, ok := lastUserContent(req.Messages)
		switch {
		case !ok:
			problem = fmt.Sprintf("expect_last_user %q: the request has no user text or tool output", *want)
		case !strings.Contains(last, *want):
			problem = fmt.Sprintf("expect_last_user %q: the last user message is %s", *want, quoteShort(last))
		}
	}
	if problem == "" && e.hasExpectOutputs {
		got := trailingOutputIDs(req.Messages)
		if !slices.Equal(got, e.expectToolOutputs) {
			problem = fmt.Sprintf("expect_tool_outputs %s: the tool outputs after the last assistant message are %s",
				quoteList(e.expectToolOutputs), quoteList(got))
		}
	}
	if problem == "" {
		return nil
	}
	err := &model.Error{Status: omni.StatusFailed,
		Message: fmt.Sprintf("%s: %s (request %d of Session %q): %s", p.name, e.path, n, req.SessionID, problem)}
	p.mu.Lock()
	p.mismatches = append(p.mismatches, err)
	p.mu.Unlock()
	return err
}

// lastUserContent returns the text or output of the last user text or
// tool_call_output message.
func lastUserContent(msgs []*omni.Message) (string, bool) {
	for i := len(msgs) - 1; i >= 0; i-- {
		pl := &msgs[i].Payload
		if pl.Role != omni.RoleUser {
			continue
		}
		switch pl.Type {
		case omni.TypeText:
			return pl.Text, true
		case omni.TypeToolCallOutput:
			return pl.Output, true
		}
	}
	return "", false
}

// trailingOutputIDs returns the tool_call_ids of the tool_call_output
// messages after the last assistant message, in context order.
func trailingOutputIDs(msgs []*omni.Message) []string {
	start := 0
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Payload.Role == omni.RoleAssistant {
			start = i + 1
			break
		}
	}
	ids := []string{}
	for _, m := range msgs[start:] {
		if m.Payload.Type == omni.TypeToolCallOutput {
			ids = append(ids, m.Payload.ToolCallID)
		}
	}
	return ids
}

func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// quoteShort quotes s, cut to a readable length.
func quoteShort(s string) string {
	const limit = 200
	if r := []rune(s); len(r) > limit {
		return strconv.Quote(string(r[:limit])) + "…"
	}
	return strconv.Quote(s)
}

// title answers a title request (model.PurposeTitle) without counting it
// or playing the script: a script's "title" field, the demo's first words
// of the user's text. A script without a title fails the request, which
// leaves the Session's title as it was.
func (p *Provider) title(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	var t string
	switch {
	case p.script != nil:
		t = p.script.title
	default:
		t = demoTitle(model.TitleMaterial(req))
	}
	if t == "" {
		err := &model.Error{Status: omni.StatusFailed, Message: p.name + ": the script has no title"}
		return model.Result{StopReason: omni.StatusFailed}, err
	}
	pl := &player{emit: emit}
	if err := pl.play(ctx, []step{{kind: stepText, content: t}}); err != nil {
		return model.Result{StopReason: model.StatusOf(err)}, err
	}
	return model.Result{Usage: estimate(req, pl.outChars), StopReason: omni.StatusCompleted}, nil
}
