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
func cmdReplay(ctx context.Context, args []string) error {
	fs := newFlags("replay")
	c := newCommon("127.0.0.1:4222")
	c.flagHome(fs)
	c.flagNATS(fs, true)
	from := fs.Uint64("from-seq", 0, "first stream sequence to print")
	verbose := fs.Bool("v", false, "prefix each line with its sequence and subject")
	follow := fs.Bool("follow", false, "keep printing new messages")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: floe replay <session-id> [--from-seq N]")
	}
	sid := fs.Arg(0)
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
	err = bus.FollowUntil(ctx, js, sid, nil, *from, !*follow, func(sm bus.StreamMsg) error {
		if *verbose {
			fmt.Fprintf(w, "%d %s ", sm.Seq, sm.Subject)
		}
		w.Write(sm.Data)
		w.WriteByte('\n')
		if *follow {
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
