package toolrunner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/sandbox"
	"floe.dev/services/toolrunner"
)

// BenchmarkToolThroughput is tool throughput with 4 toolrunners on one
// embedded broker, unconfined and confined (the backend auto picks): three
// pools of 4 runners each — "off", "confined" and "control", a second
// unconfined pool — and every iteration a round of 64 exec_command calls
// (`true`) through each pool in turn, the order rotated each iteration so
// no pool keeps a position (the round after a confined one may pay for
// work the kernel deferred from it), and all see the same machine load.
// It reports each pool's calls per second and CPU per call, and their
// ratios to "off" (issue 20: confined throughput unchanged within noise);
// control/off is the benchmark's own noise, measured in the same run.
func BenchmarkToolThroughput(b *testing.B) {
	const runners, round = 4, 64
	if sb, err := sandbox.New(sandbox.Config{}); err != nil || sb.Backend() == sandbox.Off {
		b.Skip("no sandbox backend on this host")
	} else {
		b.Logf("confined: %s", sb.Backend())
		sb.Close()
	}
	env := bustest.Start(b, bus.Config{})
	ws := b.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var done []chan error
	defer func() {
		cancel()
		for _, d := range done {
			<-d
		}
	}()
	pools := []string{"off", "confined", "control"}
	for _, pool := range pools {
		for i := range runners {
			cfg := toolrunner.Config{Pool: pool, RunnerID: fmt.Sprintf("%s-%d", pool, i), ShutdownGrace: 100 * time.Millisecond}
			if pool != "confined" {
				cfg.Sandbox.Backend = "off"
			}
			nc := bustest.Connect(b, env.Server)
			d := make(chan error, 1)
			done = append(done, d)
			go func() { d <- toolrunner.Run(ctx, nc, cfg, zerolog.Nop()) }()
		}
	}
	// Every runner of the confined pool confines (none fell back to off).
	for range 4 * runners {
		var list omni.ToolList
		bustest.Eventually(b, time.Minute, "a tool list reply", func() bool {
			resp, err := env.Conn.Request(toolrunner.ToolListSubject("confined"), nil, 10*time.Second)
			return err == nil && omni.Unpack(resp.Data, &list) == nil
		})
		if list.Sandbox == nil || list.Sandbox.Backend == string(sandbox.Off) {
			b.Fatalf("a runner of the confined pool runs tools unconfined: %+v", list.Sandbox)
		}
	}
	// Count complete outputs as they are published.
	var completed atomic.Int64
	nc := bustest.Connect(b, env.Server)
	sub, err := nc.Subscribe("floe.session.>", func(m *nats.Msg) {
		if msg, err := omni.Decode(m.Data); err == nil && msg.Payload.Type == omni.TypeToolCallOutput {
			completed.Add(1)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	args, _ := json.Marshal(map[string]any{"description": "bench", "cmd": "true"})
	n := 0
	runRound := func(pool string) (time.Duration, time.Duration) {
		start, cpu0 := time.Now(), cpuTime()
		want := completed.Load() + round
		for range round {
			n++
			sid := fmt.Sprintf("s-%d", n%16)
			j := omni.ToolJob{SessionID: sid, ToolCallID: fmt.Sprintf("tc-%d", n), Name: "exec_command",
				Arguments: string(args), Workspace: ws, EnqueuedUnixMs: time.Now().UnixMilli()}
			m, err := bus.PackMsg(omni.ToolSubject(pool, sid), j)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := env.JS.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
		}
		deadline := time.Now().Add(2 * time.Minute)
		for completed.Load() < want {
			if time.Now().After(deadline) {
				b.Fatalf("%s: %d of %d outputs after 2 min", pool, completed.Load()-want+round, round)
			}
			time.Sleep(time.Millisecond)
		}
		return time.Since(start), cpuTime() - cpu0
	}
	for _, pool := range pools {
		runRound(pool) // warm every pool (the confined one's namespaces)
	}
	wall, cpu := map[string]time.Duration{}, map[string]time.Duration{}
	for i := 0; b.Loop(); i++ {
		for k := range pools {
			pool := pools[(i+k)%len(pools)]
			t, c := runRound(pool)
			wall[pool], cpu[pool] = wall[pool]+t, cpu[pool]+c
		}
	}
	calls := float64(b.N * round)
	for _, pool := range pools {
		b.ReportMetric(calls/wall[pool].Seconds(), pool+"-calls/s")
	}
	for _, pool := range pools {
		b.ReportMetric(cpu[pool].Seconds()*1e3/calls, pool+"-cpu-ms/call")
	}
	for _, pool := range pools[1:] {
		b.ReportMetric(wall["off"].Seconds()/wall[pool].Seconds(), pool+"/off-throughput")
		b.ReportMetric(cpu[pool].Seconds()/cpu["off"].Seconds(), pool+"/off-cpu")
	}
}

// cpuTime is the CPU time (user and system) of this process and of its
// children waited for: a round's share is the CPU its calls cost here
// (the runners, the broker, the commands), whatever else the machine
// runs. Work the kernel defers to its own threads is not in it.
func cpuTime() time.Duration {
	var self, children syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	var t time.Duration
	for _, tv := range []syscall.Timeval{self.Utime, self.Stime, children.Utime, children.Stime} {
		t += time.Duration(tv.Nano())
	}
	return t
}
