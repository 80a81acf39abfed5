package consume_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/tracer/internal/consume"
	tt "floe.dev/services/tracer/internal/tracertest"
)

const sid = "session-2026-11-29-20-10-22-1a2b3c4d"

var errKilled = errors.New("killed")

func options(home string) consume.Options {
	return consume.Options{
		Home: home, Durable: "floe-tracer", Batch: 1024, BatchBytes: 16 << 20,
		FetchWait: 5 * time.Second, AckWait: 30 * time.Second, MaxOpen: 256,
		RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond,
	}
}

// crash runs the loop until a hook kills it and checks that Run returned
// the hook's error.
func crash(t *testing.T, env *bustest.Env, o consume.Options) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := consume.Run(ctx, env.Conn, o, zerolog.New(zerolog.NewTestWriter(t)))
	if !errors.Is(err, errKilled) {
		t.Fatalf("Run = %v, want the hook's error", err)
	}
}

// run runs the loop until the test ends.
func run(t *testing.T, env *bustest.Env, o consume.Options, log zerolog.Logger) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consume.Run(ctx, env.Conn, o, log) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func consumerInfo(t *testing.T, env *bustest.Env) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := env.JS.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// Killed after writing records, before recording their position: the
// restarted tracer truncates them and rewrites them from the redelivery,
// in order, although newer messages were published meanwhile.
func TestKilledBetweenWriteAndPosition(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	half := len(items) / 2
	tt.Publish(t, env.JS, items[:half]...)

	o := options(home)
	o.Hooks.AfterWrite = func(uint64) error { return errKilled }
	crash(t, env, o)

	pos := tt.Pos(t, home, sid)
	if pos.Seq != 0 || fileSize(t, pos.File) <= pos.Size {
		t.Fatalf("after the kill: position %+v, file size %d; want records past an unadvanced position", pos, fileSize(t, pos.File))
	}
	if info := consumerInfo(t, env); info.NumAckPending == 0 {
		t.Fatalf("after the kill: nothing pending on the consumer (%+v)", info)
	}

	tt.Publish(t, env.JS, items[half:]...)
	run(t, env, options(home), zerolog.New(zerolog.NewTestWriter(t)))
	tt.WaitTrace(t, env.JS, home, sid)
}

// Killed with extra unrecorded lines and a torn line past the recorded
// size (as a kill between write and position leaves them).
func TestUnrecordedLinesAndTornTailAreTruncated(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	half := len(items) / 2
	var logs bustest.Buffer

	stop := run(t, env, options(home), zerolog.New(&logs))
	tt.Publish(t, env.JS, items[:half]...)
	want, _ := tt.Expected(t, env.JS, sid)
	if !tt.Poll(10*time.Second, func() bool { return bytes.Equal(tt.Trace(t, home, sid), want) }) {
		t.Fatal("first half not traced")
	}
	stop()

	pos := tt.Pos(t, home, sid)
	f, err := os.OpenFile(pos.File, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	extra := append(append([]byte(nil), items[half].Data...), '\n')
	extra = append(extra, items[half+1].Data[:17]...)
	if _, err := f.Write(extra); err != nil {
		t.Fatal(err)
	}
	f.Close()

	tt.Publish(t, env.JS, items[half:]...)
	run(t, env, options(home), zerolog.New(&logs))
	tt.WaitTrace(t, env.JS, home, sid)
	if !strings.Contains(logs.String(), "truncated unrecorded trace tail") {
		t.Errorf("no log line about the truncation:\n%s", logs.String())
	}
}

// Killed after recording the position, before the ack: the redelivered
// records are skipped by sequence.
func TestKilledBetweenPositionAndAck(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	half := len(items) / 2
	tt.Publish(t, env.JS, items[:half]...)

	o := options(home)
	o.Hooks.AfterFlush = func(uint64) error { return errKilled }
	crash(t, env, o)

	pos := tt.Pos(t, home, sid)
	info := consumerInfo(t, env)
	if pos.Seq == 0 || info.AckFloor.Stream >= pos.Seq || fileSize(t, pos.File) != pos.Size {
		t.Fatalf("after the kill: position %+v, ack floor %d; want a recorded position ahead of the ack floor", pos, info.AckFloor.Stream)
	}

	tt.Publish(t, env.JS, items[half:]...)
	run(t, env, options(home), zerolog.New(zerolog.NewTestWriter(t)))
	tt.WaitTrace(t, env.JS, home, sid)
}

// Killed after a rotation was written but not recorded: the unrecorded
// _002 is removed and written again.
func TestKilledDuringRotation(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := []tt.Item{tt.Msg(t, sid, tt.Meta(sid)), tt.Msg(t, sid, tt.Tools()), tt.Msg(t, sid, omni.UserText("hi"))}
	items = append(items, tt.Turn(t, sid, 0)...)
	items = append(items,
		tt.Msg(t, sid, omni.CompactionBegin(omni.CompactContext, omni.ModeDiscard, 9000, 1)),
		tt.Msg(t, sid, omni.CompactionEnd(omni.CompactContext, omni.ModeDiscard, omni.StatusCompleted)))
	tt.Publish(t, env.JS, items...)
	rotation := tt.Publish(t, env.JS, tt.Msg(t, sid, tt.Meta(sid)), tt.Msg(t, sid, tt.Tools()))

	o := options(home)
	o.Hooks.AfterWrite = func(last uint64) error {
		if last >= rotation[0] {
			return errKilled
		}
		return nil
	}
	crash(t, env, o)
	if files, _ := trace.Files(home, sid); len(files) != 2 || tt.Pos(t, home, sid).Index != 1 {
		t.Fatalf("after the kill: files %v, position %+v; want an unrecorded _002", files, tt.Pos(t, home, sid))
	}

	tt.Publish(t, env.JS, tt.Msg(t, sid, omni.UserText("after compaction")))
	run(t, env, options(home), zerolog.New(zerolog.NewTestWriter(t)))
	tt.WaitTrace(t, env.JS, home, sid)
	files, _ := trace.Files(home, sid)
	if len(files) != 2 {
		t.Fatalf("files = %v, want _001 and _002", files)
	}
	head, err := os.ReadFile(files[1])
	if err != nil {
		t.Fatal(err)
	}
	msgs, _, _ := trace.Read(bytes.NewReader(head))
	if len(msgs) != 3 || !msgs[0].IsSessionMeta() || msgs[1].Payload.Type != omni.TypeToolListReady {
		t.Errorf("_002 = %s, want session_meta, tool_list_ready, text", head)
	}
}

// On a server without the consumer reset API the loop re-creates the
// consumer at its ack floor; later starts keep its start sequence.
func TestKilledThenRecoveredWithoutResetAPI(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	home := t.TempDir()
	items := tt.Session(t, sid)
	half := len(items) / 2
	tt.Publish(t, env.JS, items[:half]...)

	o := options(home)
	o.Hooks.NoReset = true
	o.Hooks.AfterWrite = func(uint64) error { return errKilled }
	crash(t, env, o)

	tt.Publish(t, env.JS, items[half:]...)
	o.Hooks.AfterWrite = nil
	stop := run(t, env, o, zerolog.New(zerolog.NewTestWriter(t)))
	tt.WaitTrace(t, env.JS, home, sid)
	stop()
	if info := consumerInfo(t, env); info.Config.DeliverPolicy != jetstream.DeliverByStartSequencePolicy {
		t.Errorf("consumer deliver policy = %v, want by start sequence after re-creation", info.Config.DeliverPolicy)
	}

	// A normal start must accept the re-created consumer.
	tt.Publish(t, env.JS, tt.Msg(t, sid, omni.UserText("one more")))
	run(t, env, options(home), zerolog.New(zerolog.NewTestWriter(t)))
	tt.WaitTrace(t, env.JS, home, sid)
}
