package runner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/toolrunner/internal/tools"
)

// countingBox runs every call at once, counting executions.
type countingBox struct {
	mu  sync.Mutex
	ran map[string]int
}

func (b *countingBox) List(context.Context) ([]omni.ToolSpec, []omni.MCPConnectResult) {
	return nil, nil
}
func (b *countingBox) Servers() []string { return nil }
func (b *countingBox) Execute(_ context.Context, call tools.Call, _ tools.Emit) tools.Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ran[call.Env[1]]++
	return tools.Result{Output: "ran"}
}
func (b *countingBox) runs(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ran["FLOE_TOOL_CALL_ID="+id]
}

// ackRig is a runner on a real broker with its ack replaced by fail,
// which gets the attempt number, the job and the real ack.
type ackRig struct {
	env   *bustest.Env
	box   *countingBox
	beats chan omni.Heartbeat
}

func startAckRig(t *testing.T, budget time.Duration, fail func(attempt int, m jetstream.Msg, ack func() error) error) *ackRig {
	t.Helper()
	var mu sync.Mutex
	attempts := map[uint64]int{}
	oldAck, oldBudget := doubleAck, ackBudget
	doubleAck = func(ctx context.Context, m jetstream.Msg) error {
		md, _ := m.Metadata()
		mu.Lock()
		attempts[md.Sequence.Stream]++
		n := attempts[md.Sequence.Stream]
		mu.Unlock()
		return fail(n, m, func() error { return m.DoubleAck(ctx) })
	}
	ackBudget = budget
	t.Cleanup(func() { doubleAck, ackBudget = oldAck, oldBudget })

	rig := &ackRig{env: bustest.Start(t, bus.Config{}), box: &countingBox{ran: map[string]int{}},
		beats: make(chan omni.Heartbeat, 256)}
	if _, err := rig.env.Conn.Subscribe(omni.HeartbeatSubject("*"), func(m *nats.Msg) {
		var hb omni.Heartbeat
		if omni.Unpack(m.Data, &hb) == nil {
			select {
			case rig.beats <- hb:
			default:
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	nc := bustest.Connect(t, rig.env.Server) // closed after Run returns (cleanups run last-in first-out)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, nc, Config{Pool: omni.DefaultPool, Concurrency: 2, RunnerID: "r1",
			HeartbeatInterval: 50 * time.Millisecond, ShutdownGrace: time.Second, Tools: rig.box}, zerolog.Nop())
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return rig
}

// enqueue queues a job for call id of Session sid as the engine does and
// returns its sequence.
func (rig *ackRig) enqueue(t *testing.T, sid, id string) uint64 {
	t.Helper()
	nm, err := bus.PackMsg(omni.ToolSubject(omni.DefaultPool, sid), &omni.ToolJob{SessionID: sid, ToolCallID: id,
		Name: "exec_command", Arguments: `{"cmd":"true"}`, Workspace: t.TempDir(), BeatToken: "tok-" + id})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := rig.env.JS.PublishMsg(context.Background(), nm)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// outputs counts the complete outputs of call id on the Session stream.
func (rig *ackRig) outputs(t *testing.T, sid, id string) int {
	t.Helper()
	n := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bus.Follow(ctx, rig.env.JS, sid, []string{omni.ClassModel}, 0, true, func(sm bus.StreamMsg) error {
		if m, err := omni.Decode(sm.Data); err == nil && m.Payload.Type == omni.TypeToolCallOutput && m.Payload.ToolCallID == id {
			n++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// The runner's ack is applied but its answer is lost (a leader change):
// the runner does not read that as "not delivered". It sends the ack
// again, the server confirms it (the job is acked), and the runner runs
// the job: once, with one output, and the job is gone from the queue.
func TestAnAckAppliedButUnansweredStillRunsTheJob(t *testing.T) {
	lost := errors.New("ack answer lost")
	var rig *ackRig
	rig = startAckRig(t, 5*time.Second, func(attempt int, m jetstream.Msg, ack func() error) error {
		if attempt == 1 {
			// Applied (the server answers), but the answer never reaches
			// the runner.
			if _, err := rig.env.Conn.Request(m.Reply(), []byte("+ACK"), 5*time.Second); err != nil {
				t.Errorf("applying the ack: %v", err)
			}
			return lost
		}
		return ack()
	})
	const sid = "session-ack-1"
	seq := rig.enqueue(t, sid, "call_1")
	bustest.Eventually(t, 10*time.Second, "the job's output", func() bool { return rig.outputs(t, sid, "call_1") == 1 })
	if n := rig.box.runs("call_1"); n != 1 {
		t.Fatalf("the job ran %d times, want once", n)
	}
	// Its heartbeats carried the job's token (the engine counts no other).
	beats := 0
	for len(rig.beats) > 0 {
		hb := <-rig.beats
		for i, id := range hb.ToolCallIDs {
			if id != "call_1" {
				continue
			}
			beats++
			if i >= len(hb.Tokens) || hb.Tokens[i] != "tok-call_1" {
				t.Errorf("heartbeat %+v without call_1's token", hb)
			}
		}
	}
	if beats == 0 {
		t.Error("no heartbeat for call_1")
	}
	st, err := rig.env.JS.Stream(context.Background(), omni.ToolsStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetMsg(context.Background(), seq); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the job is still queued after it ran (%v)", err)
	}
}

// The runner's ack is never confirmed (the server cannot be reached):
// the runner keeps confirming it for its budget, reporting the job in
// heartbeats meanwhile (so the engine does not fail it as not started
// while the runner decides), then gives up without running it and stops
// reporting it. The engine then fails the call once the heartbeats stop
// and withdraws the job, which is still queued (never acked): it runs
// nowhere, rather than twice.
func TestAnAckNeverConfirmedIsNotRunAndStopsBeating(t *testing.T) {
	rig := startAckRig(t, 600*time.Millisecond, func(int, jetstream.Msg, func() error) error {
		return context.DeadlineExceeded
	})
	const sid = "session-ack-2"
	seq := rig.enqueue(t, sid, "call_2")
	var beatAt, lastBeat time.Time
	deadline := time.After(3 * time.Second)
collect:
	for {
		select {
		case hb := <-rig.beats:
			for _, id := range hb.ToolCallIDs {
				if id == "call_2" {
					if beatAt.IsZero() {
						beatAt = time.Now()
					}
					lastBeat = time.Now()
				}
			}
		case <-deadline:
			break collect
		}
	}
	if beatAt.IsZero() {
		t.Fatal("the job was never reported while its ack was being confirmed")
	}
	if time.Since(lastBeat) < time.Second {
		t.Errorf("the job is still reported %v after the runner gave up", time.Since(lastBeat))
	}
	if n := rig.box.runs("call_2"); n != 0 {
		t.Errorf("the job ran %d times without a confirmed ack", n)
	}
	if n := rig.outputs(t, sid, "call_2"); n != 0 {
		t.Errorf("%d outputs for a job never run", n)
	}
	// Still queued, so the engine can withdraw it.
	st, err := rig.env.JS.Stream(context.Background(), omni.ToolsStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetMsg(context.Background(), seq); err != nil {
		t.Errorf("the job is not in the queue: %v", err)
	}
}
