package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

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

// broker is the parent's handle on a broker child.
type broker struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	url  string
	done chan struct{} // closed when the child has exited
}

// startBroker starts this program again as a broker child storing under
// dir, and waits for its URL.
func startBroker(ctx context.Context, dir string) (*broker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: broker: %w", err)
	}
	store := filepath.Join(dir, "jetstream")
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, fmt.Errorf("bench: broker: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), BrokerEnv+"="+store)
	cmd.Stderr = os.Stderr
	b := &broker{cmd: cmd, done: make(chan struct{})}
	if b.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	b.out = bufio.NewReader(stdout)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: broker: %w", err)
	}
	go func() {
		_ = cmd.Wait() // the exit status is not the benchmark's concern
		close(b.done)
	}()
	line := make(chan string, 1)
	go func() {
		l, _ := b.out.ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	select {
	case b.url = <-line:
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	if !strings.HasPrefix(b.url, "nats://") {
		b.stop()
		return nil, errors.New("bench: broker child gave no URL")
	}
	return b, nil
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

// stop closes the child's stdin (it shuts its server down and exits) and
// kills it if it has not exited within 10 s. It may be called again.
func (b *broker) stop() {
	b.in.Close()
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill()
		<-b.done
	}
}
