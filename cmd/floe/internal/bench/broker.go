package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"floe.dev/pkg/bus/embed"
)

// BrokerEnv, set to a store directory, makes the benchmark program a
// broker child instead (RunBroker): a nats-server in a process of its
// own, as in a deployment, so a scenario can measure the Floe services'
// memory and the broker's apart.
const BrokerEnv = "FLOE_BENCH_BROKER"

// RunBroker serves the child side of a broker: it starts an embedded
// nats-server on a loopback port of its own, writes its URL as the first
// line of stdout, then answers each "snap" line on stdin with one JSON
// memSnap line (after the same collection as snapshot); it shuts the
// server down when stdin closes. It returns the exit code.
func RunBroker(store string) int {
	srv, err := embed.Start(embed.Options{StoreDir: store, Listen: "127.0.0.1:0"})
	if err != nil {
		fmt.Fprintf(os.Stderr, "floebench broker: %v\n", err)
		return 1
	}
	defer srv.Shutdown()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, srv.ClientURL())
	out.Flush()
	enc := json.NewEncoder(out)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() != "snap" {
			fmt.Fprintf(os.Stderr, "floebench broker: unknown request %q\n", sc.Text())
			return 1
		}
		if err := enc.Encode(snapshot()); err != nil {
			return 1
		}
		out.Flush()
	}
	return 0
}

// broker is the parent's handle on a broker child; stop closes its stdin
// (it shuts its server down and exits).
type broker struct{ *child }

// startBroker starts this program again as a broker child storing under
// dir, and waits for its URL.
func startBroker(ctx context.Context, dir string) (*broker, error) {
	store := filepath.Join(dir, "jetstream")
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, fmt.Errorf("bench: broker: %w", err)
	}
	c, err := startChild(ctx, "broker", BrokerEnv+"="+store, "nats://")
	if err != nil {
		return nil, err
	}
	return &broker{c}, nil
}

// snapshot asks the child for its memory, measured as snapshot measures
// this process.
func (b *broker) snapshot() (memSnap, error) {
	var m memSnap
	if _, err := io.WriteString(b.in, "snap\n"); err != nil {
		return m, fmt.Errorf("bench: broker snapshot: %w", err)
	}
	line, err := b.out.ReadBytes('\n')
	if err != nil {
		return m, fmt.Errorf("bench: broker snapshot: %w", err)
	}
	if err := json.Unmarshal(line, &m); err != nil {
		return m, fmt.Errorf("bench: broker snapshot: %w", err)
	}
	return m, nil
}
