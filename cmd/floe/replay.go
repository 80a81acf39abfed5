package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/omni"
)

// cmdReplay prints a Session's stream from JetStream, one raw body per line
// (with -v: seq and subject first). It connects to FLOE_NATS_URL, else to a
// running `floe serve` on FLOE_NATS_LISTEN, else opens the store itself.
//
// With --execute it re-executes the Session instead (replayExecute) and
// exits 1 when the new Trace differs from the recorded one.
func cmdReplay(ctx context.Context, _ context.CancelFunc, name string, args []string) (int, error) {
	fs := newFlags(name)
	c := newCommon("127.0.0.1:4222")
	c.flagHome(fs)
	c.flagNATS(fs, true)
	from := fs.Uint64("from-seq", 0, "first stream sequence to print")
	verbose := fs.Bool("v", false, "prefix each line with its sequence and subject")
	follow := fs.Bool("follow", false, "keep printing new messages")
	execute := fs.Bool("execute", false, "re-run the Session through the engine from its own record and compare the new Trace with it (exit 1 when they differ, 2 when it cannot replay)")
	diff := fs.Bool("diff", false, "with --execute: print the first record where the Traces part, with context")
	traceFile := fs.String("trace", "", "with --execute: the recorded Trace file to re-run (default: the Session's Trace under --home)")
	if err := parse(fs, args); err != nil {
		return 2, err
	}
	if *execute {
		if fs.NArg() > 1 || (fs.NArg() == 0 && *traceFile == "") {
			return 2, errors.New("usage: floe replay --execute <session-id> [--diff] | floe replay --execute --trace FILE [--diff]")
		}
		return replayExecute(ctx, c, fs.Arg(0), *traceFile, *diff)
	}
	if fs.NArg() != 1 {
		return 2, errors.New("usage: floe replay <session-id> [--from-seq N] | floe replay --execute <session-id> [--diff] [--trace FILE]")
	}
	return 0, printStream(ctx, c, fs.Arg(0), *from, *verbose, *follow)
}

// printStream prints a Session's stream (floe replay without --execute).
func printStream(ctx context.Context, c *common, sid string, from uint64, verbose, follow bool) error {
	if !omni.ValidSessionID(sid) {
		return fmt.Errorf("invalid session id %q", sid)
	}
	nc, cleanup, err := replayConn(c)
	if err != nil {
		return err
	}
	defer cleanup()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	// An unknown Session is an error, not an empty stream.
	n, err := countSession(ctx, js, sid)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("session %s not found (no Sessions stored yet)", sid)
	}
	if err == nil && n == 0 {
		known := false
		if sessions, err := bus.Open(ctx, js); err == nil {
			_, _, err := sessions.Get(ctx, sid)
			known = err == nil
		}
		if !known {
			return fmt.Errorf("session %s not found", sid)
		}
	}
	err = bus.FollowUntil(ctx, js, sid, nil, from, !follow, func(sm bus.StreamMsg) error {
		if verbose {
			fmt.Fprintf(w, "%d %s ", sm.Seq, sm.Subject)
		}
		w.Write(sm.Data)
		w.WriteByte('\n')
		if follow {
			return w.Flush()
		}
		return nil
	})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func replayConn(c *common) (*nats.Conn, func(), error) {
	if c.natsURL != "" {
		opts, err := c.auth.options()
		if err != nil {
			return nil, nil, err
		}
		nc, err := nats.Connect(c.natsURL, opts...)
		if err != nil {
			return nil, nil, err
		}
		return nc, func() { nc.Close() }, nil
	}
	if c.listen != "" && c.listen != "off" {
		if nc, err := localNATS(c.home, c.listen, embed.UserOps); err == nil {
			return nc, func() { nc.Close() }, nil
		}
	}
	srv, err := embed.Start(embed.Options{StoreDir: filepath.Join(c.home, "jetstream")})
	if err != nil {
		return nil, nil, err
	}
	nc, err := srv.Connect()
	if err != nil {
		srv.Shutdown()
		return nil, nil, err
	}
	return nc, func() { nc.Close(); srv.Shutdown() }, nil
}

// countSession counts the messages FLOE_SESSIONS holds for sid.
func countSession(ctx context.Context, js jetstream.JetStream, sid string) (uint64, error) {
	st, err := js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(omni.SessionWildcard(sid)))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}
