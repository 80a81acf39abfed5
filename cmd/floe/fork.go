package main

import (
	"context"
	"errors"
	"fmt"

	"floe.dev/services/gateway/client"
)

// cmdFork forks a Session (protocol.md §8, the fork route): through a running
// gateway with --server, or straight into $FLOE_HOME (the gateway's own
// route in-process) without one. It prints the new Session's id.
func cmdFork(ctx context.Context, _ context.CancelFunc, name string, args []string) (int, error) {
	fs := newFlags(name)
	c := newCommon("off")
	c.flagHome(fs)
	at := fs.Uint64("at", 0, "stream sequence to cut at, the <seq> of an SSE event id (default: everything so far)")
	server := fs.String("server", "", "gateway URL to fork through, e.g. http://127.0.0.1:7364 (token from FLOE_API_TOKEN); default: straight into --home")
	if err := parse(fs, args); err != nil {
		return 2, err
	}
	if fs.NArg() != 1 {
		return 2, errors.New("usage: floe fork <session-id> [--at SEQ] [--server URL]")
	}
	var fork *client.Session
	var err error
	if *server != "" {
		fork, err = serverClient(*server).Fork(ctx, fs.Arg(0), *at)
	} else {
		err = withDirectClient(ctx, c, "fork", func(cl *client.Client) (err error) {
			fork, err = cl.Fork(ctx, fs.Arg(0), *at)
			return err
		})
	}
	if err != nil {
		return 1, err
	}
	fmt.Println(fork.ID)
	return 0, nil
}
