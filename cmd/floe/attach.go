package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"floe.dev/cmd/floe/internal/render"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// attachTasks is how many of the last Tasks attach renders by default:
// the Web App's window.
const attachTasks = 50

// cmdAttach renders a Session live from a gateway, like `floe run` does:
// it connects SSE first, fetches the history, renders it, then the live
// events the history did not cover; it ends when the running Task ends
// (with --follow, when interrupted).
func cmdAttach(ctx context.Context, _ context.CancelFunc, name string, args []string) (int, error) {
	fs := newFlags(name)
	url := fs.String("url", "", "gateway URL (default http://$FLOE_HTTP_ADDR)")
	follow := fs.Bool("follow", false, "keep rendering after the running Task ends")
	history := fs.Bool("history", true, "render the Session's history first (its last --tasks Tasks)")
	tasks := fs.Int("tasks", attachTasks, "how many of the last Tasks --history renders (0: all)")
	if err := parse(fs, args); err != nil {
		return 2, err
	}
	if fs.NArg() != 1 {
		return 2, errors.New("usage: floe attach <session-id> [--url URL] [--follow]")
	}
	sid := fs.Arg(0)
	base := *url
	if base == "" {
		base = "http://" + env("FLOE_HTTP_ADDR", "127.0.0.1:7364")
	}
	var opts []client.Option
	if tok := gateway.ClientToken(os.Getenv("FLOE_API_TOKEN")); tok != "" {
		opts = append(opts, client.WithToken(tok))
	}
	c := client.New(base, opts...)
	stream, err := c.Stream(ctx, sid, "")
	if err != nil {
		return 1, err
	}
	var hist *client.Messages
	if *tasks > 0 {
		hist, err = c.MessagesWindow(ctx, sid, *tasks, "")
	} else {
		hist, err = c.Messages(ctx, sid)
	}
	if err != nil {
		return 1, err
	}
	r := render.New(os.Stdout, isTTY(os.Stdout))
	var cursor uint64
	if *history {
		if hist.Window != nil && hist.Window.More {
			fmt.Fprintf(os.Stdout, "… earlier Tasks not shown (--tasks 0 shows all)\n")
		}
		for _, raw := range hist.Messages {
			var m omni.Message
			if omni.Unmarshal(raw, &m) == nil {
				r.Message(&m)
			}
		}
	}
	if hist.Live == nil {
		r.TaskEnd("") // the last Task is over
	} else {
		cursor, _ = hist.Live.CursorSeq()
		for _, raw := range hist.Live.Fragments {
			var m omni.Message
			if omni.Unmarshal(raw, &m) == nil {
				r.Message(&m)
			}
		}
	}
	asker := newAttachAsker(ctx, c, sid)
	defer asker.close()
	running := false
	for ev := range stream.C {
		if ev.Event == client.EventServer {
			var se omni.ServerEvent
			if json.Unmarshal(ev.Data, &se) != nil {
				continue
			}
			r.Server(&se)
			switch se.Type {
			case omni.ServerApprovalRequest:
				asker.request(&se)
			case omni.ServerTaskState:
				if se.State == omni.StateIdle {
					asker.endAll()
					if running {
						r.TaskEnd(se.Status)
					}
				}
				if se.State != omni.StateIdle {
					running = true
				} else if !*follow && (running || hist.Live == nil) {
					r.Flush()
					if se.Status != "" {
						fmt.Fprintf(os.Stderr, "floe: session %s %s\n", sid, se.Status)
					}
					return exitFor(se.Status), nil
				}
			}
			continue
		}
		if seq := seqOf(ev.ID); seq != 0 && seq <= cursor {
			continue // covered by the history
		}
		var m omni.Message
		if omni.Unmarshal(ev.Data, &m) == nil {
			r.Message(&m)
			if m.Type == omni.KindEvent && m.Payload.Type == omni.TypeApprovalDecision {
				asker.decided(m.Payload.ToolCallID, m.Payload.Decision)
			}
		}
	}
	r.Flush()
	if err := stream.Err(); err != nil {
		return 1, err
	}
	return 0, nil
}

func exitFor(status string) int {
	switch status {
	case "", omni.StatusCompleted:
		return 0
	case omni.StatusAborted:
		return 130
	}
	return 1
}

func seqOf(id string) uint64 {
	_, s, ok := strings.Cut(id, "-")
	if !ok {
		return 0
	}
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// attachAsker asks attach's approvals on the terminal, one at a time in
// the order they come (a question waiting for an answer never holds the
// stream back). A call decided elsewhere (another client, a person in the
// Web App) while asked or queued is dropped: its question ends, and the
// next line answers the next question, never a stale call.
type attachAsker struct {
	ctx     context.Context
	c       *client.Client
	sid     string
	lines   <-chan string
	allowed toolSet
	queue   chan omni.Message
	done    chan struct{}

	mu      sync.Mutex
	pending map[string]chan string // tool call id → its decision, when made elsewhere
}

func newAttachAsker(ctx context.Context, c *client.Client, sid string) *attachAsker {
	a := &attachAsker{ctx: ctx, c: c, sid: sid, queue: make(chan omni.Message, 256), done: make(chan struct{}), pending: map[string]chan string{}}
	if isTTY(os.Stdin) {
		a.lines = stdinLines()
	}
	go a.run()
	return a
}

func (a *attachAsker) close() {
	a.endAll() // a question still waiting for a line ends
	close(a.queue)
	<-a.done
}

// request queues the question of an approval request (once per call).
func (a *attachAsker) request(se *omni.ServerEvent) {
	var tc omni.Message
	if omni.Unmarshal(se.ToolCall, &tc) != nil || a.lines == nil {
		return // no terminal: leave it to another client
	}
	id := tc.Payload.ToolCallID
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.pending[id]; ok {
		return // a reconnect's snapshot repeats it
	}
	a.pending[id] = make(chan string, 1)
	select {
	case a.queue <- tc:
	default:
		delete(a.pending, id) // far behind: another client answers
	}
}

// decided notes a decision seen on the stream.
func (a *attachAsker) decided(toolCallID, decision string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if g, ok := a.pending[toolCallID]; ok {
		g <- decision
		delete(a.pending, toolCallID)
	}
}

// endAll drops every question: the Task ended.
func (a *attachAsker) endAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, g := range a.pending {
		g <- ""
		delete(a.pending, id)
	}
}

func (a *attachAsker) run() {
	defer close(a.done)
	for tc := range a.queue {
		id := tc.Payload.ToolCallID
		a.mu.Lock()
		gone, ok := a.pending[id]
		a.mu.Unlock()
		if !ok {
			continue // decided before its turn came
		}
		auto := a.allowed.has(tc.Payload.Name)
		d := askApproval(tc.Payload.Name, a.lines, nil, gone, &a.allowed)
		a.mu.Lock()
		delete(a.pending, id)
		a.mu.Unlock()
		if d == "" {
			continue
		}
		var err error
		if d == answerAlways {
			err = a.c.AllowForSession(a.ctx, a.sid, id)
		} else {
			err = a.c.Approve(a.ctx, a.sid, id, d)
		}
		switch {
		case auto && client.IsCode(err, omni.CodeNotFound):
			// allowed with its tool already
		case client.IsCode(err, omni.CodeNotFound):
			fmt.Fprintln(os.Stderr, "(already answered elsewhere)")
		case err != nil:
			fmt.Fprintf(os.Stderr, "floe: approve: %v\n", err)
		}
	}
}
