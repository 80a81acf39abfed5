package faults

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// replayTimeout bounds one run of scripts/replay-session, including a first
// `go install` of the nats CLI into the project's bin/ directory.
const replayTimeout = 5 * time.Minute

// scripts/replay-session against a running `floe serve` (listening for NATS
// clients on a free port via FLOE_NATS_LISTEN) prints the Session's stream
// exactly: every message from the start sequence on, raw bodies, in stream
// order, and then exits.
func TestReplaySessionScriptPrintsTheStream(t *testing.T) {
	dir := t.TempDir()
	home, ws := filepath.Join(dir, "floe-home"), filepath.Join(dir, "ws")
	for _, d := range []string{home, ws, filepath.Join(dir, "home")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	natsPort, httpPort := freePort(t), freePort(t)
	env := append(baseEnv(), "HOME="+filepath.Join(dir, "home"), "FLOE_HOME="+home,
		fmt.Sprintf("FLOE_NATS_LISTEN=127.0.0.1:%d", natsPort), fmt.Sprintf("FLOE_HTTP_ADDR=127.0.0.1:%d", httpPort),
		"FLOE_WORKSPACE_ROOTS="+ws, "FLOE_SCRIPTS_DIR="+dir)
	var ps procs
	serve := startProc(t, dir, "serve", bins.floe, env, "serve")
	ps.add(serve)
	t.Cleanup(func() {
		if t.Failed() {
			ps.dump(t)
		}
		ps.stopAll(10 * time.Second)
	})
	serve.waitLog(t, "floe serve:", 60*time.Second)

	script := filepath.Join(dir, "script.json")
	if err := os.WriteFile(script, []byte(`{"requests":[
		{"steps":[{"thinking":"Let me look.","chunks":2},{"text":"Listing <files> & \"more\".","chunks":3},
			{"tool_call":{"name":"exec_command","id":"call_a","arguments":{"description":"ls","cmd":"echo one; echo two"}}}]},
		{"steps":[{"text":"Done.","chunks":2}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gw := client.New(fmt.Sprintf("http://127.0.0.1:%d", httpPort))
	sess, err := gw.CreateSession(ctx, client.CreateSession{Model: "scripted:" + script, Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.SubmitTask(ctx, sess.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "replay me"}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the task to end", func() bool {
		s, err := gw.GetSession(ctx, sess.ID)
		return err == nil && s.State == omni.StateIdle && s.LastStatus != ""
	})

	url := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	// floe serve's port requires a user: a raw client is refused, the
	// admin it generated reads the stream, and the script finds the ops
	// user's password under FLOE_HOME by itself.
	if nc, err := nats.Connect(url, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("connected to floe serve's NATS port without credentials")
	}
	pw, err := os.ReadFile(filepath.Join(home, "nats", "admin.password"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.UserInfo("admin", strings.TrimSpace(string(pw))))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	want := streamOf(t, js, sess.ID)
	if len(want) < 10 {
		t.Fatalf("only %d messages on the stream", len(want))
	}
	scriptEnv := append(baseEnv(), "HOME="+filepath.Join(dir, "home"), "FLOE_NATS_URL="+url, "FLOE_HOME="+home)
	checkReplay(t, scriptEnv, sess.ID, want, 0)
	checkReplay(t, scriptEnv, sess.ID, want, len(want)/2)
}

// The same script as the read-only ops user of deploy/nats/auth.conf,
// against a server that enforces the permission sets.
func TestReplaySessionScriptAsOpsUser(t *testing.T) {
	c := newCluster(t, 1, 1)
	c.service("toolrunner", "toolrunner")
	c.service("engine", "engine")
	sid := c.session(c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{text("Running.", 2, 0), execCall("call_a", "echo hi")}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}}))
	if _, status := c.wait(sid, c.submit(sid, "as ops"), 60*time.Second, nil); status != omni.StatusCompleted {
		t.Fatalf("task ended %q", status)
	}
	want := streamOf(t, c.js, sid)
	env := c.env("replay", "FLOE_NATS_USER=ops", "FLOE_NATS_PASSWORD="+c.passwords["ops"])
	checkReplay(t, env, sid, want, 0)
	c.noViolations()
}

// streamOf reads a Session's whole stream: sequences and raw bodies.
func streamOf(t *testing.T, js jetstream.JetStream, sid string) []bus.StreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []bus.StreamMsg
	err := bus.Follow(ctx, js, sid, nil, 0, true, func(sm bus.StreamMsg) error {
		sm.Data = append([]byte(nil), sm.Data...)
		out = append(out, sm)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkReplay runs scripts/replay-session from the sequence of want[from]
// and checks it printed want[from:], one body per line.
func checkReplay(t *testing.T, env []string, sid string, want []bus.StreamMsg, from int) {
	t.Helper()
	start := want[from].Seq
	out, err := runScript(t, replayTimeout, env, "scripts/replay-session", sid, strconv.FormatUint(start, 10))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n"))
	want = want[from:]
	if len(lines) != len(want) {
		t.Fatalf("replay from seq %d printed %d lines, the stream has %d messages:\n%s", start, len(lines), len(want), out)
	}
	for i := range lines {
		if !bytes.Equal(lines[i], want[i].Data) {
			t.Fatalf("replay from seq %d, line %d:\ngot  %s\nwant %s (seq %d)", start, i, lines[i], want[i].Data, want[i].Seq)
		}
	}
}
