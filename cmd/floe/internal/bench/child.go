package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// child is the parent's handle on this program started again as a child
// (a broker, a model server): its stdin takes requests, its stdout gives
// its URL as the first line and then the answers.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	url  string
	done chan struct{} // closed when the child has exited
}

// startChild starts this program again with env added to its
// environment, and waits (30 s at most, or until ctx ends) for the first
// line of its stdout, its URL, which must begin with scheme. what names
// the child in errors.
func startChild(ctx context.Context, what, env, scheme string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", what, err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	c := &child{cmd: cmd, done: make(chan struct{})}
	if c.in, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", what, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", what, err)
	}
	c.out = bufio.NewReader(stdout)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", what, err)
	}
	go func() {
		_ = cmd.Wait() // the exit status is not the benchmark's concern
		close(c.done)
	}()
	line := make(chan string, 1)
	go func() {
		l, _ := c.out.ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	select {
	case c.url = <-line:
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	if !strings.HasPrefix(c.url, scheme) {
		c.stop()
		return nil, fmt.Errorf("bench: %s child gave no URL", what)
	}
	return c, nil
}

// stop closes the child's stdin (it exits) and kills it if it has not
// exited within 10 s. It may be called again.
func (c *child) stop() {
	c.in.Close()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}
