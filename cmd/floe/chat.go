package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"floe.dev/cmd/floe/internal/render"
	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// resumeFlag is --resume with an optional Session id: `--resume` alone
// takes the most recent Session, `--resume ID` or `--resume=ID` that one.
type resumeFlag struct {
	set bool
	id  string
}

func (f *resumeFlag) String() string { return f.id }
func (f *resumeFlag) Set(v string) error {
	f.set = true
	if v != "true" {
		f.id = v
	}
	return nil
}
func (f *resumeFlag) IsBoolFlag() bool { return true }

// chatOpts are floe chat's settings.
type chatOpts struct {
	c           *common
	workspace   string
	approve     string
	approveSet  bool
	modelSet    bool
	resume      resumeFlag
	server      string
	thinking    string
	maxTurns    int
	fullOutput  bool
	interactive bool // a line editor on a terminal
	askOK       bool // approvals can be asked (stdin is a terminal)

	// Set by the chat: its Session and the last stream sequence of a
	// message the tracer writes.
	sid        string
	lastTraced uint64
	// failed is closed when an in-process service stops on its own.
	failed <-chan struct{}
}

func cmdChat(_ context.Context, stopSignals context.CancelFunc, name string, args []string) (int, error) {
	fs := newFlags(name)
	o := &chatOpts{c: newCommon("off")}
	c := o.c
	c.flagHome(fs)
	c.flagNATS(fs, true)
	c.flagModel(fs, "model reference")
	c.flagLog(fs)
	c.flagVerbose(fs)
	cwd, _ := os.Getwd()
	fs.StringVar(&o.workspace, "workspace", cwd, "the Workspace the tools work in")
	fs.StringVar(&o.approve, "approve", omni.ApproveAllowAll, "approval mode: allow-all, deny-all, read-only, always-ask")
	fs.Var(&o.resume, "resume", "continue a Session: alone, the most recent one; --resume SESSION_ID, that one")
	fs.StringVar(&o.server, "server", "", "a running gateway (floe serve) instead of in-process services; token from FLOE_API_TOKEN")
	fs.StringVar(&o.thinking, "thinking", "", "thinking level: low, medium, high")
	fs.IntVar(&o.maxTurns, "max-turns", 0, "stop a Task after this many model requests (0 = unlimited)")
	fs.BoolVar(&o.fullOutput, "full-output", false, "show long tool output whole instead of folded")
	if err := parse(fs, args); err != nil {
		return 2, err
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "approve":
			o.approveSet = true
		case "model":
			o.modelSet = true
		}
	})
	if os.Getenv("FLOE_MODEL") != "" {
		o.modelSet = true
	}
	switch {
	case fs.NArg() == 1 && o.resume.set && o.resume.id == "":
		o.resume.id = fs.Arg(0)
	case fs.NArg() > 0:
		return 2, fmt.Errorf("unexpected argument %q: floe chat reads its prompts from the terminal (see 'floe chat --help')", fs.Arg(0))
	}
	if o.resume.id != "" && !omni.ValidSessionID(o.resume.id) {
		return 2, fmt.Errorf("--resume %q is not a session id", o.resume.id)
	}
	if !omni.ValidApprovalMode(o.approve) {
		return 2, fmt.Errorf("--approve %q: want allow-all, deny-all, read-only or always-ask", o.approve)
	}
	ws, err := filepath.Abs(o.workspace)
	if err != nil {
		return 2, err
	}
	o.workspace = ws
	o.interactive = isTTY(os.Stdin) && isTTY(os.Stdout)
	o.askOK = isTTY(os.Stdin)

	// The terminal's Ctrl-C is ours from here on (its meaning depends on
	// the state); SIGTERM still ends the command.
	stopSignals()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()

	var cl *client.Client
	var home string // the Trace root when the services run in-process
	maxAttempts := 0
	if o.server != "" {
		if o.modelSet {
			if err := checkModelRef(c.model); err != nil {
				return 2, err
			}
		} else {
			c.model = "" // the server's default
		}
		var copts []client.Option
		if tok := gateway.ClientToken(os.Getenv("FLOE_API_TOKEN")); tok != "" {
			copts = append(copts, client.WithToken(tok))
		}
		cl = client.New(strings.TrimRight(o.server, "/"), copts...)
		if err := checkServer(ctx, cl, o.server); err != nil {
			return 1, err
		}
	} else {
		if !o.resume.set {
			if st, err := os.Stat(ws); err != nil || !st.IsDir() {
				return 2, fmt.Errorf("workspace %s is not a directory", ws)
			}
			if o.workspace, err = checkWorkspace(c.home, ws); err != nil {
				return 2, err
			}
		}
		eng, err := engineConfig(c)
		if err != nil {
			return 2, err
		}
		if !o.resume.set || o.modelSet {
			if err := checkModel(eng, c.model); err != nil {
				return 2, err
			}
		}
		maxAttempts = eng.RetryMax + 1
		var stop func(idle bool)
		roots := o.workspace // the one Workspace a new Session may use
		if o.resume.set {
			roots = "" // none created: the defaults
		}
		cl, stop, o.failed, err = startLocal(ctx, c, eng, roots)
		if err != nil {
			return 1, err
		}
		idle := false
		defer func() {
			if idle && o.sid != "" {
				waitTrace(c.home, o.sid, o.lastTraced) // the Trace is whole before the tracer stops
			}
			stop(idle)
		}()
		home = c.home
		var code int
		code, idle, err = runChat(ctx, o, cl, home, maxAttempts)
		return code, err
	}
	code, _, err := runChat(ctx, o, cl, home, maxAttempts)
	return code, err
}

// checkModelRef checks a model reference's shape and provider without
// the keys (a --server's engine has its own).
func checkModelRef(ref string) error {
	prov, id, ok := strings.Cut(ref, ":")
	if !ok || prov == "" || id == "" {
		return fmt.Errorf("model %q is not provider:model_id (e.g. openai:gpt-4o-mini, anthropic:claude-sonnet-4-5, scripted:demo)", ref)
	}
	switch prov {
	case "openai", "anthropic", "scripted":
		return nil
	}
	return fmt.Errorf("model %s: unknown provider %q (want openai, anthropic or scripted)", ref, prov)
}

// checkServer makes one call that needs the token, so an unreachable
// server or a refused token is one line before anything else.
func checkServer(ctx context.Context, cl *client.Client, url string) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := cl.ListSessions(cctx)
	var ae *client.APIError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae) && ae.Status == http.StatusUnauthorized:
		return fmt.Errorf("the server at %s refused the token: set FLOE_API_TOKEN to one of its tokens", url)
	case errors.As(err, &ae):
		return fmt.Errorf("the server at %s: %s", url, ae.Message)
	}
	var ue interface{ Unwrap() error }
	cause := err
	for errors.As(cause, &ue) && ue.Unwrap() != nil {
		cause = ue.Unwrap()
	}
	return fmt.Errorf("cannot reach the server at %s: %v", url, cause)
}

// startLocal starts every service in-process (embedded NATS, like floe
// run) and serves the gateway's API on a loopback port of its own, behind
// a token of this run only, so the chat uses the same Session API as
// with --server.
func startLocal(ctx context.Context, c *common, eng *engine.Config, workspace string) (*client.Client, func(idle bool), <-chan struct{}, error) {
	if c.natsURL == "" {
		if err := checkFree(c.listen, "FLOE_NATS_LISTEN / --nats-listen"); err != nil {
			return nil, nil, nil, err
		}
	}
	busCfg, err := c.busConfig()
	if err != nil {
		return nil, nil, nil, err
	}
	connect, err := c.auth.options()
	if err != nil {
		return nil, nil, nil, err
	}
	log, closeLog, err := c.fileLogger("chat")
	if err != nil {
		return nil, nil, nil, err
	}
	trc, err := toolrunnerConfig(c)
	if err != nil {
		closeLog()
		return nil, nil, nil, err
	}
	tr, err := tracerConfig(c)
	if err != nil {
		closeLog()
		return nil, nil, nil, err
	}
	st, err := stack.Start(ctx, stack.Options{
		Home: c.home, NatsURL: c.natsURL, Listen: c.listen, Bus: busCfg, Connect: connect,
		Engine: eng, Toolrunner: trc, Tracer: tr,
	}, log)
	if err != nil {
		closeLog()
		return nil, nil, nil, err
	}
	token := randHex(16)
	cfg := gateway.Config{
		// The token names no principal: in-process Sessions have none, like
		// floe run's and those of a floe serve without tokens, so chat
		// --resume finds them all.
		Addr: "127.0.0.1:0", Home: c.home, DefaultModel: c.model, Tokens: map[string]string{token: ""},
		CheckModel: func(ref string) error { return checkModel(eng, ref) },
	}
	if workspace != "" {
		cfg.WorkspaceRoots = []string{workspace} // checked above, like floe run's
	}
	h, release, err := gateway.NewHandler(ctx, st.Conn, cfg, log.With().Str("service", "gateway").Logger())
	if err != nil {
		st.Stop()
		closeLog()
		return nil, nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		release()
		st.Stop()
		closeLog()
		return nil, nil, nil, err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	// stop: with nothing running (idle), without waiting out the
	// services' pull timeouts.
	stop := func(idle bool) {
		release()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = hs.Shutdown(sctx)
		cancel()
		if idle {
			st.StopIdle()
		} else {
			st.Stop()
		}
		closeLog()
	}
	return client.New("http://"+ln.Addr().String(), client.WithToken(token)), stop, st.Failed(), nil
}

// chat is one `floe chat`: its Session, the terminal and the stream.
type chat struct {
	o    *chatOpts
	cl   *client.Client
	home string
	con  console
	r    *render.Renderer
	sess *client.Session

	running   bool
	taskID    string
	approvals []pendingApproval // asked one at a time, oldest first
	// waiting are approval requests whose tool call is not on screen yet
	// (a reconnect's snapshot lists the pending ones ahead of the replay):
	// each is asked once its call is shown. shown holds the calls shown.
	waiting   []waitingApproval
	shown     map[string]bool
	queued    []string // piped lines waiting for the running Task
	steered   []string // steering sent, not yet delivered
	lastCtrlC time.Time
	aborting  bool
	cursor    uint64    // stream events at or below it were in the history
	used      bool      // the Session has history worth resuming
	exit      bool      // a queued /exit ran
	retryAt   time.Time // when the failed model request is retried (countdown)
	allowed   toolSet   // tools allowed for the rest of the Session ("a")
	// last is the position of the last record seen (a history record's
	// or a stream event's); prompts the position before each Prompt seen
	// or in the history loaded (zero: nothing before it), for /rewind;
	// earlier the window cursor of the history before those (empty: none).
	last    forkPoint
	prompts []forkPoint
	earlier string
}

// forkPoint is where /fork and /rewind cut a Session: a stream sequence
// (an SSE id's) or a record position from /messages (protocol.md §3, the
// fork route's atSeq and atRecord). The zero value is before everything.
type forkPoint struct {
	seq      uint64
	record   int
	byRecord bool
}

func (p forkPoint) zero() bool { return !p.byRecord && p.seq == 0 }

type pendingApproval struct {
	toolCallID, tool string
}

type waitingApproval struct {
	se    omni.ServerEvent
	tc    omni.Message
	key   string
	since time.Time
}

// waitMax bounds how long an approval request waits for its tool call to
// be shown (a call outside the history shown on resume never comes): then
// it is asked anyway.
const waitMax = 3 * time.Second

// callKey names a tool call in the stream: its subagent path and id.
func callKey(origin []string, toolCallID string) string {
	return strings.Join(origin, "/") + "|" + toolCallID
}

// show renders a message and notes a complete tool call as shown, asking
// the approval that waited for it.
func (ch *chat) show(ctx context.Context, m *omni.Message) {
	ch.r.Message(m)
	if m.Type != omni.KindModel || m.IsPartial() || m.Payload.Type != omni.TypeToolCall {
		return
	}
	k := callKey(m.Origin, m.Payload.ToolCallID)
	if ch.shown == nil {
		ch.shown = make(map[string]bool)
	}
	ch.shown[k] = true
	for i, w := range ch.waiting {
		if w.key == k {
			ch.waiting = append(ch.waiting[:i], ch.waiting[i+1:]...)
			ch.ask(ctx, &w.se, &w.tc)
			return
		}
	}
}

// askStale asks the approval requests that waited waitMax for their call.
func (ch *chat) askStale(ctx context.Context) {
	for len(ch.waiting) > 0 && time.Since(ch.waiting[0].since) >= waitMax {
		w := ch.waiting[0]
		ch.waiting = ch.waiting[1:]
		ch.ask(ctx, &w.se, &w.tc)
	}
}

// runChat runs the chat until it ends; idle reports that no Task was
// running at the end.
func runChat(ctx context.Context, o *chatOpts, cl *client.Client, home string, maxAttempts int) (code int, idle bool, err error) {
	ch := &chat{o: o, cl: cl, home: home}
	sess, resumed, err := ch.openSession(ctx)
	if err != nil {
		return 1, true, err
	}
	ch.sess = sess
	o.sid = sess.ID
	ch.used = resumed
	if !resumed {
		demoNotice(sess.Model)
	}

	stream, err := cl.Stream(ctx, sess.ID, "")
	if err != nil {
		return 1, true, fmt.Errorf("stream session %s: %w", sess.ID, err)
	}
	var con console
	if o.interactive {
		tc, err := newTTYConsole()
		if err != nil {
			return 1, true, err
		}
		con = tc
	} else {
		con = newPlainConsole(os.Stdin, os.Stdout)
	}
	ch.con = con
	ch.r = render.New(con, o.interactive && os.Getenv("NO_COLOR") == "")
	ch.r.MaxAttempts = maxAttempts
	ch.r.Full = o.fullOutput

	ch.banner(resumed)
	if resumed {
		if err := ch.showHistory(ctx); err != nil {
			con.Close()
			return 1, true, err
		}
	}
	ch.updatePrompt()

	// Ctrl-C outside the line editor (piped input, or between two reads).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt)
	defer signal.Stop(sigs)

	code, err = ch.loop(ctx, stream, sigs)
	ch.r.Flush()
	con.Close()
	idle = ch.leave(ctx)
	return code, idle, err
}

// openSession creates the chat's Session or finds the one to resume.
func (ch *chat) openSession(ctx context.Context) (*client.Session, bool, error) {
	o := ch.o
	if !o.resume.set {
		s, err := ch.cl.CreateSession(ctx, client.CreateSession{
			Model: o.c.model, Workspace: o.workspace, ApprovalMode: o.approve, MaxTurns: o.maxTurns,
		})
		if err != nil {
			return nil, false, fmt.Errorf("create session: %s", apiMessage(err))
		}
		return s, false, nil
	}
	id := o.resume.id
	if id == "" {
		list, err := ch.cl.ListSessions(ctx)
		if err != nil {
			return nil, false, fmt.Errorf("list sessions: %w", err)
		}
		var last *client.Session
		for i := range list {
			if s := &list[i]; s.Parent == "" && (last == nil || s.CreatedUnixMs >= last.CreatedUnixMs) {
				last = s
			}
		}
		if last == nil {
			return nil, false, errors.New("no session to resume: start one with floe chat")
		}
		id = last.ID
	}
	s, err := ch.cl.GetSession(ctx, id)
	if client.IsCode(err, omni.CodeNotFound) {
		return nil, false, fmt.Errorf("no session %s (floe chat --resume without an id takes the most recent)", id)
	}
	if err != nil {
		return nil, false, fmt.Errorf("session %s: %w", id, err)
	}
	if o.approveSet && o.approve != s.ApprovalMode {
		mode := o.approve
		if s, err = ch.cl.PatchSession(ctx, id, client.SessionPatch{ApprovalMode: &mode}); err != nil {
			return nil, false, fmt.Errorf("set approval mode: %w", err)
		}
	}
	if o.modelSet && o.c.model != "" && o.c.model != s.Model {
		fmt.Fprintf(os.Stderr, "floe: session %s keeps its model %s (--model applies to new sessions)\n", s.ID, s.Model)
	}
	return s, true, nil
}

func (ch *chat) say(format string, args ...any) {
	ch.r.Flush()
	fmt.Fprintf(ch.con, format+"\n", args...)
}

func (ch *chat) banner(resumed bool) {
	s := ch.sess
	verb := "session"
	if resumed {
		verb = "resumed session"
	}
	ch.say("floe chat — %s %s · model %s · approvals %s", verb, s.ID, s.Model, s.ApprovalMode)
	if s.Title != "" {
		ch.say("title %s", s.Title)
	}
	ch.say("workspace %s", s.Workspace)
	if ch.o.interactive {
		ch.say("Type a message and Enter. Typing while a Task runs steers it. /help for commands; Ctrl-D or /exit leaves.")
	}
}

// historyTurns is how many of the last turns a resumed chat shows.
const historyTurns = 3

// showHistory renders the last few turns of the Session from /messages
// (the newest window of historyTurns Tasks, so a long Session costs no
// more than a short one) and what a running Task has streamed so far.
func (ch *chat) showHistory(ctx context.Context) error {
	h, err := ch.cl.MessagesWindow(ctx, ch.sess.ID, historyTurns, "")
	if err != nil {
		return fmt.Errorf("session history: %w", err)
	}
	var msgs []omni.Message
	for _, raw := range h.Messages {
		var m omni.Message
		if omni.Unmarshal(raw, &m) == nil {
			msgs = append(msgs, m)
		}
	}
	ch.prompts, ch.earlier = promptPoints(h), ""
	if len(h.Positions) > 0 {
		ch.last = forkPoint{record: h.Positions[len(h.Positions)-1], byRecord: true}
	}
	if h.Window != nil && h.Window.More {
		ch.say("… earlier turns not shown")
		if len(h.Positions) == len(h.Messages) {
			ch.earlier = h.Window.Start
		}
	}
	for i := range msgs {
		ch.show(ctx, &msgs[i])
	}
	if h.Live == nil {
		ch.r.TaskEnd("") // the last Task is over
	} else {
		ch.cursor, _ = h.Live.CursorSeq()
		for _, raw := range h.Live.Fragments {
			var m omni.Message
			if omni.Unmarshal(raw, &m) == nil {
				ch.show(ctx, &m)
			}
		}
	}
	ch.r.Flush()
	return nil
}

// promptPoints returns the position before each Prompt of a /messages
// answer (none when it carries no positions).
func promptPoints(h *client.Messages) []forkPoint {
	if len(h.Positions) != len(h.Messages) {
		return nil
	}
	var out []forkPoint
	for i, raw := range h.Messages {
		var m omni.Message
		if omni.Unmarshal(raw, &m) != nil || !isPrompt(&m) {
			continue
		}
		if p := h.Positions[i]; p > 0 {
			out = append(out, forkPoint{record: p - 1, byRecord: true})
		} else {
			out = append(out, forkPoint{})
		}
	}
	return out
}

// isPrompt reports whether m is a Prompt the user typed (not steering, a
// summary or another bracketed system text, nor a hook's context).
func isPrompt(m *omni.Message) bool {
	p := &m.Payload
	return m.Type == omni.KindModel && len(m.Origin) == 0 && p.Type == omni.TypeText && p.Role == omni.RoleUser &&
		p.Sender == "" && !strings.HasPrefix(p.Text, "[")
}

// earlierPrompts reads the history before what the chat holds, a page at a
// time, until it knows n Prompts or the history's start: /rewind N
// reaches Prompts from before this process (after --resume).
func (ch *chat) earlierPrompts(ctx context.Context, n int) error {
	for pages := 0; len(ch.prompts) < n && ch.earlier != "" && pages < 1000; pages++ {
		h, err := ch.cl.MessagesWindow(ctx, ch.sess.ID, min(max(n-len(ch.prompts), 1), 10_000), ch.earlier)
		if err != nil {
			return err
		}
		ch.earlier = ""
		if h.Window != nil && h.Window.More && len(h.Positions) == len(h.Messages) {
			ch.earlier = h.Window.Start
		}
		ch.prompts = append(promptPoints(h), ch.prompts...)
	}
	return nil
}

// loop is the chat's one goroutine that owns its state: stream events,
// terminal input and signals.
func (ch *chat) loop(ctx context.Context, stream *client.Stream, sigs <-chan os.Signal) (int, error) {
	eof := false
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if ch.exit || eof && !ch.running && len(ch.queued) == 0 {
			return 0, nil
		}
		select {
		case <-ctx.Done():
			return 0, nil
		case ev, ok := <-stream.C:
			if !ok {
				if err := stream.Err(); err != nil {
					return 1, fmt.Errorf("stream: %w", err)
				}
				return 1, errors.New("the stream ended")
			}
			ch.onEvent(ctx, ev)
		case <-tick.C:
			ch.countdown()
			if len(ch.waiting) == 0 {
				continue
			}
			ch.askStale(ctx)
		case <-ch.o.failed:
			return 1, errors.New("a service stopped on its own; see $FLOE_HOME/logs/floe-chat.log")
		case <-sigs:
			if ch.interrupt(ctx, "") {
				return 0, nil
			}
		case in := <-ch.con.Events():
			switch in.kind {
			case inInterrupt:
				if ch.interrupt(ctx, in.text) {
					return 0, nil
				}
			case inEOF:
				if len(ch.approvals) > 0 {
					ch.answer(ctx, omni.DecisionDeny)
				}
				if ch.o.interactive {
					return 0, nil
				}
				eof = true
			case inLine:
				if ch.line(ctx, in.text) {
					return 0, nil
				}
			}
		}
		ch.updatePrompt()
	}
}

// interrupt is Ctrl-C: deny a pending approval, else abort the running
// Task, else clear the line, else exit; a second Ctrl-C within 2 s always
// exits. It reports whether to exit.
func (ch *chat) interrupt(ctx context.Context, line string) bool {
	now := time.Now()
	double := now.Sub(ch.lastCtrlC) < 2*time.Second
	ch.lastCtrlC = now
	switch {
	case double:
		return true
	case len(ch.approvals) > 0:
		ch.answer(ctx, omni.DecisionDeny)
	case ch.running:
		ch.abort(ctx)
	case line != "":
		// the editor has cleared it
	default:
		return true
	}
	return false
}

func (ch *chat) abort(ctx context.Context) {
	if !ch.running {
		ch.say("nothing is running")
		return
	}
	ch.aborting = true
	ch.say("interrupting… (Ctrl-C again to leave)")
	if _, err := ch.cl.Abort(ctx, ch.sess.ID); err != nil {
		ch.say("abort: %v", err)
	}
}

// line handles one submitted line; it reports whether to exit.
func (ch *chat) line(ctx context.Context, text string) bool {
	if len(ch.approvals) > 0 && ch.o.askOK {
		d, ok := parseAnswer(text)
		if !ok {
			ch.say("answer y (or Enter) to allow, n to deny, a to allow %s for the rest of the session", ch.approvals[0].tool)
			return false
		}
		if d == answerAlways {
			a := ch.approvals[0]
			ch.approvals = ch.approvals[1:]
			ch.allowed.add(a.tool)
			// Stored with the Session: the engine allows the tool's later
			// calls, whichever client runs the next Task.
			if err := ch.cl.AllowForSession(ctx, ch.sess.ID, a.toolCallID); err != nil && !client.IsCode(err, omni.CodeNotFound) {
				ch.say("could not answer the approval: %s", apiMessage(err))
			}
			ch.say("%s", ch.dim("allowing "+a.tool+" for the rest of this session"))
			// Its other calls waiting for an answer were allowed with it.
			ch.approvals = slices.DeleteFunc(ch.approvals, func(p pendingApproval) bool { return p.tool == a.tool })
			return false
		}
		ch.answer(ctx, d)
		return false
	}
	text = strings.TrimSpace(text)
	if text == "" {
		return false
	}
	if ch.running && !ch.o.interactive {
		ch.queued = append(ch.queued, text) // piped input: line by line, each after the Task before it
		return false
	}
	return ch.do(ctx, text)
}

// do runs a command or a prompt (steering while a Task runs); it reports
// whether to exit.
func (ch *chat) do(ctx context.Context, text string) bool {
	if strings.HasPrefix(text, "/") {
		return ch.command(ctx, text)
	}
	if ch.running {
		ch.steer(ctx, text)
		return false
	}
	ch.submit(ctx, text)
	return false
}

func (ch *chat) submit(ctx context.Context, text string) {
	if ch.o.interactive {
		ch.r.SkipUser++ // the editor shows the line already
	}
	id, err := ch.cl.SubmitTask(ctx, ch.sess.ID, client.TaskRequest{
		Input: []client.InputPart{{Type: client.InputText, Text: text}}, ThinkingLevel: ch.o.thinking,
	})
	if err != nil {
		if ch.o.interactive {
			ch.r.SkipUser--
		}
		ch.say("could not start the task: %s", apiMessage(err))
		return
	}
	ch.used = true
	ch.startTask(id)
}

func (ch *chat) startTask(id string) {
	ch.running, ch.taskID, ch.aborting = true, id, false
}

func (ch *chat) steer(ctx context.Context, text string) {
	err := ch.cl.Steer(ctx, ch.sess.ID, text)
	if client.IsCode(err, omni.CodeNotRunning) {
		// The Task ended meanwhile: the line is the next prompt.
		ch.queued = append(ch.queued, text)
		return
	}
	if err != nil {
		ch.say("could not steer: %s", apiMessage(err))
		return
	}
	ch.steered = append(ch.steered, text)
	ch.say("%s", ch.dim("queued: "+text+" (delivered after the current step)"))
}

func (ch *chat) dim(s string) string {
	if ch.o.interactive && os.Getenv("NO_COLOR") == "" {
		return "\x1b[2m" + s + "\x1b[0m"
	}
	return s
}

const chatHelp = `commands:
  /compact          compact the Session's context now
  /abort            interrupt the running Task (also Ctrl-C)
  /approve [MODE]   show or set the approval mode: allow-all, deny-all, read-only, always-ask
  /fork             fork the Session here into a new one (the fork route)
  /rewind N         fork the Session before its N-th last Prompt
  /model            show the Session's model
  /session          show the Session id, Workspace and Trace file
  /help             this list
  /exit             leave (also Ctrl-D); the Session stays, resume it with --resume
keys: Enter sends; typing while a Task runs steers it; Ctrl-C denies an approval,
interrupts a Task, clears the line, or leaves at an empty prompt; up/down recall lines.`

// command runs a slash command; it reports whether to exit.
func (ch *chat) command(ctx context.Context, text string) bool {
	name, arg, _ := strings.Cut(text, " ")
	arg = strings.TrimSpace(arg)
	switch name {
	case "/exit", "/quit":
		return true
	case "/help":
		ch.say("%s", chatHelp)
	case "/abort":
		ch.abort(ctx)
	case "/model":
		ch.say("model %s", ch.sess.Model)
	case "/session":
		ch.say("session %s", ch.sess.ID)
		ch.say("workspace %s", ch.sess.Workspace)
		if s, err := ch.cl.GetSession(ctx, ch.sess.ID); err == nil && s.Sandbox != nil {
			ch.say("sandbox %s, network %s", s.Sandbox.Backend, s.Sandbox.Network)
		} else {
			ch.say("sandbox unknown (no tool runner answered)")
		}
		ch.say("trace %s", ch.tracePath(ctx))
		if s, err := ch.cl.GetSession(ctx, ch.sess.ID); err == nil && len(s.AllowedTools) > 0 {
			ch.say("allowed for this session: %s", strings.Join(s.AllowedTools, ", "))
		}
		ch.say("resume: %s", ch.resumeCommand())
	case "/approve":
		if arg == "" {
			ch.say("approval mode %s (set with /approve allow-all|deny-all|read-only|always-ask)", ch.sess.ApprovalMode)
			break
		}
		if !omni.ValidApprovalMode(arg) {
			ch.say("unknown approval mode %q: want allow-all, deny-all, read-only or always-ask", arg)
			break
		}
		s, err := ch.cl.PatchSession(ctx, ch.sess.ID, client.SessionPatch{ApprovalMode: &arg})
		if err != nil {
			ch.say("could not set the approval mode: %s", apiMessage(err))
			break
		}
		ch.sess = s
		ch.say("approval mode %s", s.ApprovalMode)
	case "/fork":
		ch.fork(ctx, forkPoint{}, "")
	case "/rewind":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 1 {
			ch.say("/rewind N forks the Session before its N-th last Prompt (N from 1)")
			break
		}
		if err := ch.earlierPrompts(ctx, n); err != nil {
			ch.say("could not read the Session's history: %s", apiMessage(err))
			break
		}
		if n > len(ch.prompts) {
			ch.say("this chat has seen %d Prompts with their positions; /rewind goes back at most that far", len(ch.prompts))
			break
		}
		at := ch.prompts[len(ch.prompts)-n]
		if at.zero() {
			ch.say("nothing of this Session comes before that Prompt: start a new chat instead")
			break
		}
		ch.fork(ctx, at, fmt.Sprintf(" before the Prompt %d back", n))
	case "/compact":
		if ch.running {
			ch.say("a Task is running: /compact when it has ended")
			break
		}
		id, err := ch.cl.Compact(ctx, ch.sess.ID)
		if client.IsCode(err, omni.CodeNothingToCompact) {
			ch.say("nothing to compact yet")
			break
		}
		if err != nil {
			ch.say("could not compact: %s", apiMessage(err))
			break
		}
		ch.startTask(id)
	default:
		ch.say("unknown command %s: /help lists the commands", name)
	}
	return false
}

// fork forks the Session at stream position at (0: everything so far)
// and says how to go on in the fork.
func (ch *chat) fork(ctx context.Context, at forkPoint, where string) {
	var f *client.Session
	var err error
	if at.byRecord {
		f, err = ch.cl.ForkAtRecord(ctx, ch.sess.ID, at.record)
	} else {
		f, err = ch.cl.Fork(ctx, ch.sess.ID, at.seq)
	}
	if err != nil {
		ch.say("could not fork: %s", apiMessage(err))
		return
	}
	if at.byRecord {
		ch.say("forked%s into %s (from %s after record %d)", where, f.ID, ch.sess.ID, at.record)
	} else {
		ch.say("forked%s into %s (from %s at %d)", where, f.ID, ch.sess.ID, f.ForkedFrom.Seq)
	}
	cmd := "floe chat --resume " + f.ID
	if ch.o.server != "" {
		cmd += " --server " + ch.o.server
	}
	ch.say("continue there: %s", cmd)
}

func (ch *chat) tracePath(ctx context.Context) string {
	if ch.home != "" {
		if pos, ok, err := trace.ReadPos(ch.home, ch.sess.ID); err == nil && ok {
			return pos.File
		}
	}
	if files, err := ch.cl.Traces(ctx, ch.sess.ID); err == nil && len(files) > 0 {
		return files[len(files)-1].Name + " (on the server: GET /api/sessions/" + ch.sess.ID + "/traces)"
	}
	return "(none yet)"
}

func (ch *chat) resumeCommand() string {
	cmd := "floe chat --resume " + ch.sess.ID
	if ch.o.server != "" {
		cmd += " --server " + ch.o.server
	}
	return cmd
}

func apiMessage(err error) string {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Message
	}
	return err.Error()
}

// answer sends the decision of the oldest pending approval.
func (ch *chat) answer(ctx context.Context, decision string) {
	a := ch.approvals[0]
	ch.approvals = ch.approvals[1:]
	ch.approve(ctx, a.toolCallID, decision)
}

func (ch *chat) approve(ctx context.Context, toolCallID, decision string) {
	if err := ch.cl.Approve(ctx, ch.sess.ID, toolCallID, decision); err != nil && !client.IsCode(err, omni.CodeNotFound) {
		ch.say("could not answer the approval: %s", apiMessage(err))
	}
}

func (ch *chat) onEvent(ctx context.Context, ev client.Event) {
	if ev.Event == client.EventServer {
		var se omni.ServerEvent
		if json.Unmarshal(ev.Data, &se) != nil {
			return
		}
		ch.onServer(ctx, &se, ev.ID == "")
		return
	}
	if seq := seqOf(ev.ID); seq != 0 && seq <= ch.cursor {
		return // shown with the history
	}
	var m omni.Message
	if omni.Unmarshal(ev.Data, &m) != nil {
		return
	}
	if seq := seqOf(ev.ID); seq > 0 && len(m.Origin) == 0 && (m.Type == omni.KindModel || m.Type == omni.KindEvent) && !m.IsPartial() {
		ch.o.lastTraced = seq
	}
	p := &m.Payload
	ch.retryAt = time.Time{}
	switch {
	case m.Type == omni.KindEvent && p.Type == omni.TypeRequestEnd && p.RetryInMs > 0 && len(m.Origin) == 0:
		ch.r.Message(&m)
		ch.retryAt = time.Now().Add(time.Duration(p.RetryInMs) * time.Millisecond)
		ch.countdown()
		return
	case m.Type == omni.KindEvent && p.Type == omni.TypeApprovalDecision:
		ch.dropApproval(p.ToolCallID)
	case isPrompt(&m):
		// A Prompt: /rewind forks at the Session's position before it.
		ch.prompts = append(ch.prompts, ch.last)
	}
	if seq := seqOf(ev.ID); seq > 0 {
		ch.last = forkPoint{seq: seq}
	}
	switch {
	case m.Type == omni.KindModel && len(m.Origin) == 0 && p.Type == omni.TypeText && p.Role == omni.RoleUser:
		if len(ch.steered) > 0 && strings.HasPrefix(p.Text, "["+omni.TagUserSteering+"]") {
			ch.steered = ch.steered[1:]
		}
	}
	ch.show(ctx, &m)
}

func (ch *chat) dropApproval(toolCallID string) {
	for i, w := range ch.waiting {
		if w.tc.Payload.ToolCallID == toolCallID {
			ch.waiting = append(ch.waiting[:i], ch.waiting[i+1:]...)
			return
		}
	}
	for i, a := range ch.approvals {
		if a.toolCallID == toolCallID {
			ch.approvals = append(ch.approvals[:i], ch.approvals[i+1:]...)
			return
		}
	}
}

// onServer handles a server event; snapshot marks the state a (re)connected
// stream starts with, which may be older than a Task just submitted.
func (ch *chat) onServer(ctx context.Context, se *omni.ServerEvent, snapshot bool) {
	switch se.Type {
	case omni.ServerApprovalRequest:
		var tc omni.Message
		if omni.Unmarshal(se.ToolCall, &tc) != nil {
			return
		}
		id := tc.Payload.ToolCallID
		for _, a := range ch.approvals {
			if a.toolCallID == id {
				return // the snapshot of a reconnect repeats it
			}
		}
		for _, w := range ch.waiting {
			if w.tc.Payload.ToolCallID == id {
				return
			}
		}
		// The user sees the call before being asked about it.
		if k := callKey(se.Origin, id); !ch.shown[k] {
			ch.waiting = append(ch.waiting, waitingApproval{se: *se, tc: tc, key: k, since: time.Now()})
			return
		}
		ch.ask(ctx, se, &tc)
	case omni.ServerTaskState:
		if se.State != omni.StateIdle {
			if !ch.running {
				ch.startTask(se.TaskID)
			}
			return
		}
		if !ch.running || se.TaskID != "" && ch.taskID != "" && se.TaskID != ch.taskID {
			return
		}
		if snapshot {
			// Read before our Task began, or after it ended while the
			// stream was away: the record says which.
			if s, err := ch.cl.GetSession(ctx, ch.sess.ID); err != nil || s.State != omni.StateIdle {
				return
			}
		}
		ch.r.TaskEnd(se.Status)
		ch.r.Flush()
		ch.running = false
		ch.approvals, ch.waiting, ch.shown = nil, nil, nil
		switch se.Status {
		case omni.StatusCompleted, "":
		case omni.StatusAborted:
			ch.say("■ task aborted")
		default:
			if ch.r.LastError != "" {
				ch.say("task %s: model request failed: %s", se.Status, ch.r.LastError)
			} else {
				ch.say("task %s", se.Status)
			}
		}
		for _, s := range ch.steered {
			ch.say("not delivered (the task ended): %s", s)
		}
		ch.steered = nil
		ch.drainQueue(ctx)
	}
}

// ask shows an approval request and queues its question.
func (ch *chat) ask(ctx context.Context, se *omni.ServerEvent, tc *omni.Message) {
	ch.r.Server(se)
	if ch.allowed.has(tc.Payload.Name) {
		ch.say("%s", allowedAlways(tc.Payload.Name))
		ch.approve(ctx, tc.Payload.ToolCallID, omni.DecisionAllow)
		return
	}
	ch.approvals = append(ch.approvals, pendingApproval{toolCallID: tc.Payload.ToolCallID, tool: tc.Payload.Name})
	if !ch.o.askOK {
		ch.say("%s%s", approvePrompt(tc.Payload.Name), noTerminal)
		ch.answer(ctx, omni.DecisionDeny)
	}
}

// drainQueue runs the lines that waited for the Task, until one starts
// another Task.
func (ch *chat) drainQueue(ctx context.Context) {
	for len(ch.queued) > 0 && !ch.running && !ch.exit {
		next := ch.queued[0]
		ch.queued = ch.queued[1:]
		ch.exit = ch.do(ctx, next)
	}
}

// countdown shows the seconds left before a failed model request is
// retried.
func (ch *chat) countdown() {
	if ch.retryAt.IsZero() || !ch.running {
		ch.con.SetStatus("")
		return
	}
	left := time.Until(ch.retryAt)
	if left <= 0 {
		ch.con.SetStatus(ch.dim("  retrying now… "))
		return
	}
	ch.con.SetStatus(ch.dim(fmt.Sprintf("  retrying in %d s… ", int(left.Seconds()+0.999))))
}

func (ch *chat) updatePrompt() {
	switch {
	case len(ch.approvals) > 0:
		ch.con.SetPrompt(approvePrompt(ch.approvals[0].tool))
	case ch.running:
		ch.con.SetPrompt("")
	default:
		ch.con.SetPrompt("> ")
	}
}

// leave ends the chat: a Task still running in-process is interrupted
// (the services stop with the command); the resume command is printed.
// It reports whether nothing runs any more.
func (ch *chat) leave(ctx context.Context) (idle bool) {
	idle = !ch.running
	if ch.running {
		if ch.home != "" {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = ch.cl.Abort(actx, ch.sess.ID)
			cancel()
		} else {
			fmt.Fprintf(os.Stdout, "the task keeps running on the server: floe attach %s --url %s\n", ch.sess.ID, ch.o.server)
		}
	}
	if ch.used {
		fmt.Fprintf(os.Stdout, "resume with: %s\n", ch.resumeCommand())
	}
	return idle
}
