package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/omni"
)

// toolrunnerConsumerPrefix names a pool's shared FLOE_TOOLS consumer
// (floe-toolrunner-<pool>); the pools of a deployment are found from it.
const toolrunnerConsumerPrefix = "floe-toolrunner-"

// cmdTools lists the tools a running deployment offers, by pool: each
// pool's answer on floe.toollist.<pool> (one runner answers), with every
// tool's source and permission and the pool's MCP servers.
func cmdTools(ctx context.Context, args []string) error {
	fs := newFlags("tools")
	c := newCommon("127.0.0.1:4222")
	c.flagNATS(fs, true)
	pool := fs.String("pool", "", "list only this pool (default: every pool with runners)")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for a pool's runners (they may be connecting MCP servers)")
	if err := parse(fs, args); err != nil {
		return err
	}
	nc, err := toolsConn(c)
	if err != nil {
		return err
	}
	defer nc.Close()
	pools := []string{*pool}
	if *pool == "" {
		if pools, err = toolPools(ctx, nc); err != nil {
			return err
		}
	}
	if len(pools) == 0 {
		return errors.New("no tool runner pool found (no floe-toolrunner-* consumer on FLOE_TOOLS): is a toolrunner running?")
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	var failed []string
	for i, p := range pools {
		if i > 0 {
			fmt.Fprintln(w)
		}
		reply, err := askPool(ctx, nc, p, *timeout)
		if err != nil {
			fmt.Fprintf(w, "pool %s: no runner answered: %v\n", p, err)
			failed = append(failed, p)
			continue
		}
		var list omni.ToolList
		if err := omni.Unpack(reply.Data, &list); err != nil {
			fmt.Fprintf(w, "pool %s: unreadable tool list: %v\n", p, err)
			failed = append(failed, p)
			continue
		}
		fmt.Fprintf(w, "pool %s (answered by %s): %d tools\n", p, list.Runner, len(list.Tools))
		fmt.Fprintln(w, "  TOOL\tSOURCE\tPERMISSION")
		for _, t := range list.Tools {
			src := t.Source
			if src == "" {
				src = "builtin"
			}
			fmt.Fprintf(w, "  %s\t%s\t%s\n", t.Name, src, t.Permission)
		}
		if len(list.MCP) > 0 {
			fmt.Fprintln(w, "  MCP SERVER\tTRANSPORT\tSTATUS\tTOOLS\tERROR")
			for _, r := range list.MCP {
				fmt.Fprintf(w, "  %s\t%s\t%s\t%d\t%s\n", r.Server, r.Transport, r.Status, r.Tools, oneLine(r.Error))
			}
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("no tool list from pool %s", strings.Join(failed, ", "))
	}
	return nil
}

// askPool requests pool's tool list, waiting up to timeout for a runner:
// a runner that is still starting (connecting its MCP servers) has not
// subscribed yet, which NATS answers at once with "no responders".
func askPool(ctx context.Context, nc *nats.Conn, pool string, timeout time.Duration) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	const maxPause = time.Second
	pause := 50 * time.Millisecond
	for {
		reply, err := nc.RequestWithContext(ctx, omni.ToolListSubject(pool), nil)
		if err == nil || !bus.IsNoResponders(err) {
			return reply, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
		pause = min(2*pause, maxPause)
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// toolsConn connects to FLOE_NATS_URL, else to a running `floe serve` on
// FLOE_NATS_LISTEN; a deployment must be running.
func toolsConn(c *common) (*nats.Conn, error) {
	if c.natsURL != "" {
		opts, err := c.auth.options()
		if err != nil {
			return nil, err
		}
		return nats.Connect(c.natsURL, opts...)
	}
	if c.listen == "" || c.listen == "off" {
		return nil, errors.New("no NATS to ask: set FLOE_NATS_URL (or --nats) or run `floe serve`")
	}
	nc, err := localNATS(c.home, c.listen, embed.UserAdmin)
	if err != nil {
		return nil, fmt.Errorf("no running floe serve on %s (set FLOE_NATS_URL for an external NATS): %w", c.listen, err)
	}
	return nc, nil
}

// toolPools returns the pools that have a runner consumer, sorted.
func toolPools(ctx context.Context, nc *nats.Conn) ([]string, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, omni.ToolsStream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", omni.ToolsStream, err)
	}
	var pools []string
	names := s.ConsumerNames(ctx)
	for n := range names.Name() {
		if p, ok := strings.CutPrefix(n, toolrunnerConsumerPrefix); ok {
			pools = append(pools, p)
		}
	}
	if err := names.Err(); err != nil {
		return nil, err
	}
	slices.Sort(pools)
	return pools, nil
}
