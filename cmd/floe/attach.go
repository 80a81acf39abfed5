package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

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
	if hist.Live != nil {
		cursor, _ = hist.Live.CursorSeq()
		for _, raw := range hist.Live.Fragments {
			var m omni.Message
			if omni.Unmarshal(raw, &m) == nil {
				r.Message(&m)
			}
		}
	}
	lines := stdinLines()
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
				go approveViaGateway(ctx, c, sid, &se, lines)
			case omni.ServerTaskState:
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

func approveViaGateway(ctx context.Context, c *client.Client, sid string, ev *omni.ServerEvent, lines <-chan string) {
	var tc omni.Message
	if omni.Unmarshal(ev.ToolCall, &tc) != nil || !isTTY(os.Stdin) {
		return // leave it to another client
	}
	d := askApproval(tc.Payload.Name, lines, nil)
	if err := c.Approve(ctx, sid, tc.Payload.ToolCallID, d); err != nil {
		fmt.Fprintf(os.Stderr, "floe: approve: %v\n", err)
	}
}
