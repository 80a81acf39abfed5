package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"

	"floe.dev/cmd/floe/internal/render"
	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/omni/cmdpolicy"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway"
)

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// isTTY reports whether f is a terminal. A character device is not enough:
// /dev/null is one, and a prompt read from it gets EOF, which would deny
// every approval of `floe attach` run with stdin from /dev/null.
func isTTY(f *os.File) bool {
	return isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())
}

func cmdRun(ctx context.Context, stopSignals context.CancelFunc, name string, args []string) (int, error) {
	fs := newFlags(name)
	c := newCommon("off")
	c.flagHome(fs)
	c.flagNATS(fs, true)
	c.flagModel(fs, "model reference")
	c.flagLog(fs)
	c.flagVerbose(fs)
	cwd, _ := os.Getwd()
	workspace := fs.String("workspace", cwd, "the Workspace the tools work in")
	approve := fs.String("approve", omni.ApproveAllowAll, "approval mode: allow-all, deny-all, read-only, always-ask")
	maxTurns := fs.Int("max-turns", 0, "stop after this many model requests (0 = unlimited)")
	thinking := fs.String("thinking", "", "thinking level: low, medium, high")
	if err := parse(fs, args); err != nil {
		return 2, err
	}
	prompt := strings.TrimSpace(strings.Join(fs.Args(), " "))
	if prompt == "" {
		fs.Usage()
		return 2, errors.New("a prompt is required")
	}
	if !omni.ValidApprovalMode(*approve) {
		return 2, fmt.Errorf("--approve %q: want allow-all, deny-all, read-only or always-ask", *approve)
	}
	ws, err := filepath.Abs(*workspace)
	if err != nil {
		return 2, err
	}
	if st, err := os.Stat(ws); err != nil || !st.IsDir() {
		return 2, fmt.Errorf("workspace %s is not a directory", ws)
	}
	if ws, err = checkWorkspace(c.home, ws); err != nil {
		return 2, err
	}
	color := useColor(os.Stdout)
	busCfg, err := c.busConfig()
	if err != nil {
		return 2, err
	}
	eng, err := engineConfig(c)
	if err != nil {
		return 2, err
	}
	if err := checkModel(eng, c.model); err != nil {
		return 2, err
	}
	instructions, err := omni.ReadInstructions(ws)
	if err != nil {
		return 2, err
	}
	connect, err := c.auth.options()
	if err != nil {
		return 2, err
	}
	trc, err := toolrunnerConfig(c)
	if err != nil {
		return 1, err
	}
	tr, err := tracerConfig(c)
	if err != nil {
		return 1, err
	}
	if c.natsURL == "" {
		if err := checkFree(c.listen, "FLOE_NATS_LISTEN / --nats-listen"); err != nil {
			return 1, err
		}
	}
	demoNotice(c.model)
	log, closeLog, err := c.fileLogger("run")
	if err != nil {
		return 1, err
	}
	defer closeLog()
	st, err := stack.Start(ctx, stack.Options{
		Home: c.home, NatsURL: c.natsURL, Listen: c.listen, Bus: busCfg, Connect: connect,
		Engine: eng, Toolrunner: trc, Tracer: tr,
	}, log)
	if err != nil {
		return 1, err
	}
	stopped := false
	defer func() {
		if !stopped {
			st.Stop()
		}
	}()

	now := time.Now().UTC()
	sid := omni.NewSessionID(now, randHex(4))
	rec := &omni.SessionRecord{
		ID: sid, Model: c.model, Workspace: ws, ApprovalMode: *approve, MaxTurns: *maxTurns, Instructions: instructions,
		State: omni.StateIdle, CreatedUnixMs: now.UnixMilli(),
	}
	if rec.Title = omni.PromptTitle(prompt); rec.Title != "" {
		rec.TitleSource = omni.TitleFromPrompt // as the gateway titles a first Task
	}
	if rec.CommandPolicy, err = cmdpolicy.Load(os.Getenv("FLOE_COMMAND_POLICY")); err != nil {
		return 2, err
	}
	opCtx := context.WithoutCancel(ctx)
	if err := st.Sessions.Create(opCtx, rec); err != nil {
		return 1, err
	}
	taskID := "task-" + randHex(8)
	if _, err := st.Sessions.Begin(opCtx, sid, omni.StateRunning, taskID); err != nil {
		return 1, err
	}
	t := omni.Task{ID: taskID, Kind: omni.TaskRun, SessionID: sid, ThinkingLevel: *thinking,
		Input: []omni.InputPart{{Type: "text", Text: prompt}}}
	if _, err := bus.SubmitTask(opCtx, st.JS, &t, nil); err != nil {
		return 1, err
	}

	r := render.New(os.Stdout, color)
	r.SkipUser = 1
	r.MaxAttempts = eng.RetryMax + 1
	var (
		status    string
		lastTrace uint64
		aborting  atomic.Bool
	)
	lines := stdinLines()
	followCtx, cancelFollow := context.WithCancel(opCtx)
	defer cancelFollow()
	// One approval at a time, in order, off the follow loop (a prompt
	// waiting for an answer must not hold the stream back).
	approvals := make(chan omni.ServerEvent, 64)
	denyAsked := make(chan struct{}, 1)
	var asking atomic.Bool
	allowed := &toolSet{}
	go func() {
		for ev := range approvals {
			asking.Store(true)
			answerApproval(st, sid, &ev, lines, denyAsked, allowed)
			asking.Store(false)
		}
	}()
	defer close(approvals)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for {
			select {
			case <-sigs:
				switch {
				case asking.Load():
					// Ctrl-C at an approval denies it, as in floe chat.
					select {
					case denyAsked <- struct{}{}:
					default:
					}
				case !aborting.Load():
					// Interrupt the Task; another Ctrl-C exits at once.
					aborting.Store(true)
					fmt.Fprintln(os.Stderr, "\nfloe: interrupting… (Ctrl-C again to exit at once)")
					go st.Conn.Request(omni.ControlSubject(sid, omni.CtlAbort), nil, 5*time.Second)
				default:
					os.Exit(130)
				}
			case <-followCtx.Done():
				return
			}
		}
	}()
	err = bus.FollowUntil(followCtx, st.JS, sid, nil, 0, false, func(sm bus.StreamMsg) error {
		switch sm.Class {
		case omni.ClassMeta, omni.ClassTrace:
			lastTrace = sm.Seq
			return nil
		case omni.ClassServer:
			var ev omni.ServerEvent
			if json.Unmarshal(sm.Data, &ev) != nil {
				return nil
			}
			r.Server(&ev)
			if ev.Type == omni.ServerApprovalRequest {
				approvals <- ev
			}
			if ev.Type == omni.ServerTaskState && ev.State == omni.StateIdle && ev.TaskID == taskID {
				status = ev.Status
				return bus.ErrStop
			}
			return nil
		}
		if sm.Class == omni.ClassModel || sm.Class == omni.ClassEvent {
			lastTrace = sm.Seq
		}
		m, err := omni.Decode(sm.Data)
		if err != nil {
			fmt.Fprintf(os.Stderr, "floe: undecodable message at seq %d: %v\n", sm.Seq, err)
			return nil
		}
		r.Message(&m)
		return nil
	})
	if err == nil {
		r.TaskEnd(status)
	}
	r.Flush()
	if err != nil {
		return 1, err
	}
	tracePath := waitTrace(c.home, sid, lastTrace)
	st.StopIdle() // nothing runs any more: no idle second after the Trace path
	stopped = true
	fmt.Fprintf(os.Stderr, "floe: session %s %s\n", sid, status)
	if tracePath != "" {
		fmt.Fprintf(os.Stderr, "floe: trace %s\n", tracePath)
	}
	switch {
	case status == omni.StatusCompleted:
		return 0, nil
	case status == omni.StatusAborted || aborting.Load():
		return 130, nil
	case r.LastError != "":
		return 1, fmt.Errorf("task %s: model request failed: %s", status, r.LastError)
	default:
		return 1, fmt.Errorf("task %s", status)
	}
}

// waitTrace waits (bounded) until the tracer has written seq and returns
// the Session's current Trace file.
func waitTrace(home, sid string, seq uint64) string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pos, ok, err := trace.ReadPos(home, sid)
		if err == nil && ok && pos.Seq >= seq {
			return pos.File
		}
		if time.Now().After(deadline) {
			if ok {
				return pos.File
			}
			return ""
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// answerApproval asks on the terminal (Enter or y allows, n denies);
// without a terminal on stdin it denies and says why. Approvals are asked
// one at a time, in the order they come.
func answerApproval(st *stack.Stack, sid string, ev *omni.ServerEvent, lines <-chan string, deny <-chan struct{}, allowed *toolSet) {
	var tc omni.Message
	if omni.Unmarshal(ev.ToolCall, &tc) != nil {
		return
	}
	decision := askApproval(tc.Payload.Name, lines, deny, nil, allowed)
	ctl := omni.Control{ToolCallID: tc.Payload.ToolCallID, Decision: decision}
	if decision == answerAlways {
		ctl.Decision, ctl.Scope = omni.DecisionAllow, omni.ScopeSession
	}
	body, _ := omni.Pack(&ctl)
	_, _ = st.Conn.Request(omni.ControlSubject(sid, omni.CtlApprove), body, 5*time.Second)
}

// approvePrompt is the question of an approval: Enter allows, as in the
// original harness.
// a allows the tool for the rest of the Session.
func approvePrompt(tool string) string { return "allow " + tool + "? [Y/n/a] " }

// answerAlways is parseAnswer's (and askApproval's) decision for "a":
// allow this call and every later call of the same tool in the Session
// without asking; sent as an allow with omni.ScopeSession, which the
// engine stores with the Session.
const answerAlways = "always"

// toolSet holds the tools allowed for the rest of a Session ("a" at an
// approval prompt). Safe for concurrent use.
type toolSet struct {
	mu sync.Mutex
	m  map[string]bool
}

func (s *toolSet) add(tool string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string]bool)
	}
	s.m[tool] = true
}

func (s *toolSet) has(tool string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[tool]
}

// allowedAlways is said when a call is allowed by an earlier "a".
func allowedAlways(tool string) string {
	return "allow " + tool + "? yes (allowed for this session)"
}

// noTerminal is said when an approval cannot be asked.
const noTerminal = "no terminal to ask: denied"

// askApproval asks on stderr and reads one line: y, yes or a bare Enter
// allow; n, no deny; anything else asks again. The end of input, or a
// Ctrl-C sent on deny, denies. Without a terminal on stdin (lines nil) it
// denies and says why.
//
// a returns answerAlways and adds the tool to allowed: a tool in allowed
// is allowed without asking (the engine, told, stores it with the Session
// and asks no more). A decision arriving on gone (the call answered
// elsewhere) ends the question with "" and says so.
func askApproval(tool string, lines <-chan string, deny <-chan struct{}, gone <-chan string, allowed *toolSet) string {
	if allowed.has(tool) {
		fmt.Fprintln(os.Stderr, allowedAlways(tool))
		return omni.DecisionAllow
	}
	if lines == nil {
		fmt.Fprintf(os.Stderr, "%s%s\n", approvePrompt(tool), noTerminal)
		return omni.DecisionDeny
	}
	for {
		fmt.Fprint(os.Stderr, approvePrompt(tool))
		select {
		case line, ok := <-lines:
			if !ok {
				fmt.Fprintln(os.Stderr)
				return omni.DecisionDeny
			}
			if d, ok := parseAnswer(line); ok {
				if d == answerAlways && allowed != nil {
					allowed.add(tool)
				}
				return d
			}
			fmt.Fprintln(os.Stderr, "answer y (or Enter) to allow, n to deny, a to allow "+tool+" for the rest of the session")
		case <-deny:
			fmt.Fprintln(os.Stderr, "^C denied")
			return omni.DecisionDeny
		case d := <-gone:
			fmt.Fprintln(os.Stderr, "(answered elsewhere: "+decisionWord(d)+")")
			return ""
		}
	}
}

// decisionWord is an approval decision as a person says it.
func decisionWord(d string) string {
	switch d {
	case omni.DecisionAllow:
		return "allowed"
	case omni.DecisionDeny:
		return "denied"
	case omni.DecisionForbidden:
		return "forbidden by policy"
	}
	return "the task ended"
}

// stdinLines reads the terminal on stdin line by line; nil when stdin is
// not a terminal (nobody to ask).
func stdinLines() <-chan string {
	if !isTTY(os.Stdin) {
		return nil
	}
	ch := make(chan string)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

// parseAnswer reads an approval answer: y, yes or empty allow; n, no
// deny; a, always answerAlways.
func parseAnswer(line string) (decision string, ok bool) {
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "", "y", "yes":
		return omni.DecisionAllow, true
	case "n", "no":
		return omni.DecisionDeny, true
	case "a", "always":
		return answerAlways, true
	}
	return "", false
}

// useColor: a terminal, and NO_COLOR unset.
func useColor(f *os.File) bool { return isTTY(f) && os.Getenv("NO_COLOR") == "" }

// demoNotice says when the offline demo model is in use.
func demoNotice(model string) {
	if strings.HasPrefix(model, "scripted:demo") {
		fmt.Fprintln(os.Stderr, "floe: using the offline demo model (scripted:demo). To use a real model set OPENAI_API_KEY or ANTHROPIC_API_KEY, or pass --model openai:<model> / anthropic:<model>.")
	}
}

// interspersed lets flags follow the prompt: floe run "prompt" --model x.
func interspersed(fs *flag.FlagSet, args []string) []string {
	var flags, rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i+1:]...)
			break
		}
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if !strings.Contains(name, "=") {
				if f := fs.Lookup(name); f != nil {
					if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !bf.IsBoolFlag() {
						if i+1 < len(args) {
							flags = append(flags, args[i+1])
							i++
						}
					}
				}
			}
			continue
		}
		rest = append(rest, a)
	}
	return append(flags, append([]string{"--"}, rest...)...)
}

// checkWorkspace checks the Workspace of a local command (floe run, floe
// chat without --server) and returns it with its links resolved. The
// person at the terminal is the operator: any directory they name is
// theirs to use, "/" aside. FLOE_WORKSPACE_ROOTS guards what HTTP clients
// of a server may ask for, not this.
func checkWorkspace(_ string, ws string) (string, error) {
	real, err := gateway.CheckWorkspace(ws, []string{ws})
	if err != nil {
		return "", fmt.Errorf("workspace %s: %w", ws, err)
	}
	return real, nil
}
