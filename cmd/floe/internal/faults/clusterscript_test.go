package faults

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// scripts/cluster up starts the compose topology as local processes, a
// Task runs through it (submitted on one gateway, watched on the other),
// status reports every process healthy, and down stops them all.
func TestClusterScriptUpStatusDown(t *testing.T) {
	state := t.TempDir()
	bin := filepath.Join(state, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// The nats-server TestMain built, so the test needs no download.
	b, err := os.ReadFile(bins.natsServer)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "nats-server"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	natsBase, httpBase := portBase(t, []int{0, 1, 2, 2000, 2001, 2002, 4000, 4001, 4002}), portBase(t, []int{0, 1})
	env := append(baseEnv(), "HOME="+state, "FLOE_CLUSTER_DIR="+filepath.Join(state, "cluster"), "FLOE_BIN_DIR="+bin,
		fmt.Sprintf("FLOE_CLUSTER_NATS_PORT=%d", natsBase), fmt.Sprintf("FLOE_CLUSTER_HTTP_PORT=%d", httpBase))
	t.Cleanup(func() {
		if _, err := runScript(t, 2*time.Minute, env, "scripts/cluster", "down"); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	// The caller has a descriptor open (a pipe, say): no process up
	// starts may keep it, or the pipe's reader would wait for them.
	held, err := os.CreateTemp(state, "held-")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if out, err := runScriptFiles(t, 5*time.Minute, env, []*os.File{held}, "scripts/cluster", "up"); err != nil {
		t.Fatalf("up: %v\n%s", err, out)
	}
	pids, _ := filepath.Glob(filepath.Join(state, "cluster", "run", "*.pid"))
	for _, pf := range pids {
		b, _ := os.ReadFile(pf)
		fds, _ := filepath.Glob(filepath.Join("/proc", strings.TrimSpace(string(b)), "fd", "*"))
		for _, fd := range fds {
			if target, _ := os.Readlink(fd); target == held.Name() {
				t.Errorf("%s holds the caller's descriptor %s", filepath.Base(pf), fd)
			}
		}
	}
	if len(pids) != 11 {
		t.Errorf("%d pid files, want 11", len(pids))
	}
	status, err := runScript(t, time.Minute, env, "scripts/cluster", "status")
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if n := strings.Count(string(status), " running "); n != 11 {
		t.Errorf("status shows %d running processes, want 11:\n%s", n, status)
	}
	if n := strings.Count(string(status), "unhealthy"); n != 0 || strings.Count(string(status), "healthy") != 5 {
		t.Errorf("status health:\n%s", status)
	}

	secrets := readEnvFile(t, filepath.Join(state, "cluster", "env"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gw1 := client.New(fmt.Sprintf("http://127.0.0.1:%d", httpBase), client.WithToken(secrets["FLOE_API_TOKEN"]))
	gw2 := client.New(fmt.Sprintf("http://127.0.0.1:%d", httpBase+1), client.WithToken(secrets["FLOE_API_TOKEN"]))
	sess, err := gw1.CreateSession(ctx, client.CreateSession{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw1.SubmitTask(ctx, sess.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "what is here?"}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the demo Task to end", func() bool {
		s, err := gw2.GetSession(ctx, sess.ID)
		return err == nil && s.State == omni.StateIdle && s.LastStatus != ""
	})
	if s, _ := gw2.GetSession(ctx, sess.ID); s.LastStatus != omni.StatusCompleted {
		t.Errorf("demo Task ended %q", s.LastStatus)
	}

	if out, err := runScript(t, 2*time.Minute, env, "scripts/cluster", "down"); err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
	status, err = runScript(t, time.Minute, env, "scripts/cluster", "status")
	if err == nil || strings.Contains(string(status), " running ") {
		t.Errorf("after down, status (%v):\n%s", err, status)
	}
	logs, _ := filepath.Glob(filepath.Join(state, "cluster", "log", "nats-*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if strings.Contains(string(b), "Violation") {
			t.Errorf("%s logs a permission violation", l)
		}
	}
}

// portBase finds a base port p such that p+o is free for every offset o.
func portBase(t *testing.T, offsets []int) int {
	t.Helper()
	for range 200 {
		// Below the kernel's ephemeral range (32768 on), which every
		// other test's free port and every outgoing connection draws
		// from: a base found free there was taken again before the
		// cluster bound it (a monitor port, "address already in use").
		base := 10000 + rand.IntN(ephemeralStart()-10000-4100)
		ok := true
		for _, o := range offsets {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+o))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

// ephemeralStart is the first port of the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), 32768 when it cannot be read or leaves no
// room below it.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 20000 {
		return 32768
	}
	return n
}

func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, exported := strings.CutPrefix(sc.Text(), "export ")
		if !exported {
			t.Errorf("%s: %q is not exported", path, sc.Text())
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}
