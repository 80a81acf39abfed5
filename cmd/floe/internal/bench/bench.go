// Package bench measures a whole Floe in one process — embedded
// nats-server, engine, toolrunner, tracer and gateway, each on its own
// connection as `floe serve` runs them — and reports pipeline throughput
// beside bare JetStream on the same bytes, publish→SSE latency at 1 to 1000
// streaming Sessions, resume time of long Traces, and what an idle Session
// and an idle SSE connection cost.
//
// Every scenario starts a fresh Floe in its own temporary FLOE_HOME, so
// one scenario's stream, caches and memory never count in another's.
// Everything runs on loopback (in-process NATS connections, HTTP on
// 127.0.0.1) and every wait is bounded. Figures are for comparing (ratios,
// medians of one run), not promises: clients, services and server share
// the machine's cores.
package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// Config selects what to measure and how much.
type Config struct {
	// Mode names the run in the report ("quick" or "full").
	Mode string
	// Partials is the number of text deltas the scripted model streams in
	// one throughput run (rounded down to whole blocks of 1000).
	Partials int
	// Runs is the number of throughput runs; medians are reported.
	Runs int
	// Rate is the aggregate publish rate of the latency scenarios
	// (partials per second over all Sessions).
	Rate float64
	// LatencyFor is how long each latency shape publishes at Rate.
	LatencyFor time.Duration
	// Sessions are the latency shapes; the idle SSE connection cost is
	// measured at the last one.
	Sessions []int
	// ResumeRecords are the Trace sizes to resume; ResumeRuns the runs each.
	ResumeRecords []int
	ResumeRuns    int
	// IdleSessions is how many idle Sessions to create.
	IdleSessions int
	// TaskSessions is how many Sessions run one real Task each through
	// the engine in the tasks scenario.
	TaskSessions int
	// TracerSessions are the Session counts of the tracer scenario, each
	// with TracerRecords records in all.
	TracerSessions []int
	TracerRecords  int
	// LongTasks is how many Tasks the long scenario runs in one Session.
	LongTasks int
	// LongProfiles, when set, is a directory where the long scenario
	// writes a CPU profile of its early Tasks (long-early.prof) and one of
	// its late Tasks (long-late.prof), to compare with pprof -diff_base.
	// Not with a whole-run CPU profile (one profile at a time).
	LongProfiles string
	// LowRateDeltas is how many deltas each Task of the lowrate scenario
	// streams (at about 500 a second), LowRateRuns how many Tasks it runs
	// with the tracer and as many without.
	LowRateDeltas, LowRateRuns int
	// Only, when not empty, limits the scenarios (throughput, latency,
	// resume, idle, tasks, tracer, long, lowrate).
	Only []string
	// Log receives the services' logs.
	Log zerolog.Logger
	// Progress receives one line per step (nil: none).
	Progress io.Writer
	// TempDir is where the scenarios' FLOE_HOMEs go (default os.TempDir()).
	TempDir string

	root string
}

// Quick is the shorter run (8 minutes on two cores at load 14, most of it
// the tracer, tasks and long scenarios). It creates 5000 idle
// Sessions, not 10 000: tracing 10 000 new Sessions alone takes over a
// minute there (see the idle scenario's "traced" figure).
func Quick() Config {
	return Config{Mode: "quick", Partials: 50_000, Runs: 3, Rate: 2000, LatencyFor: 3 * time.Second,
		Sessions: []int{1, 100, 1000}, ResumeRecords: []int{1000, 10_000, 100_000}, ResumeRuns: 3, IdleSessions: 5000,
		TaskSessions: 1000, TracerSessions: []int{100, 10_000}, TracerRecords: 100_000, LongTasks: 2000,
		LowRateDeltas: 2500, LowRateRuns: 2}
}

// Full is the complete run (longer than Quick).
func Full() Config {
	return Config{Mode: "full", Partials: 100_000, Runs: 5, Rate: 2000, LatencyFor: 15 * time.Second,
		Sessions: []int{1, 100, 1000}, ResumeRecords: []int{1000, 10_000, 100_000}, ResumeRuns: 5, IdleSessions: 10_000,
		TaskSessions: 1000, TracerSessions: []int{100, 10_000}, TracerRecords: 100_000, LongTasks: 2000,
		LowRateDeltas: 5000, LowRateRuns: 3}
}

// Report holds the results of one run.
type Report struct {
	Config     Config
	Started    time.Time
	Elapsed    time.Duration
	Throughput *ThroughputResult
	Latency    []LatencyResult
	Resume     []ResumeResult
	Idle       *IdleResult
	Tasks      *TasksIdleResult
	Tracer     []TracerResult
	OTel       *OTelResult
	Long       *LongResult
	LowRate    *LowRateResult
	Errors     []string
	// LoadBefore and LoadAfter are the machine's 1-minute load averages
	// when the run started and ended: other work on the machine shows here.
	LoadBefore, LoadAfter string
}

// Run runs the selected scenarios one after another. A scenario that fails
// is reported in Report.Errors and the others still run; the error is
// non-nil when any failed.
func Run(ctx context.Context, c Config) (*Report, error) {
	root, err := os.MkdirTemp(c.TempDir, "floe-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	c.root = root
	p := &progress{w: c.Progress, start: time.Now()}
	rep := &Report{Config: c, Started: time.Now(), LoadBefore: loadAvg()}
	want := func(name string) bool { return len(c.Only) == 0 || slices.Contains(c.Only, name) }
	fail := func(name string, err error) {
		p.logf("%s failed: %v", name, err)
		rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", name, err))
	}
	if want("throughput") && ctx.Err() == nil {
		if rep.Throughput, err = runThroughput(ctx, &c, p); err != nil {
			fail("throughput", err)
		}
	}
	if want("otel") && ctx.Err() == nil {
		if rep.OTel, err = runOTel(ctx, &c, p); err != nil {
			fail("otel", err)
		}
	}
	if want("latency") && ctx.Err() == nil {
		if rep.Latency, err = runLatency(ctx, &c, p); err != nil {
			fail("latency", err)
		}
	}
	if want("resume") && ctx.Err() == nil {
		if rep.Resume, err = runResume(ctx, &c, p); err != nil {
			fail("resume", err)
		}
	}
	if want("idle") && ctx.Err() == nil {
		if rep.Idle, err = runIdle(ctx, &c, p); err != nil {
			fail("idle", err)
		}
	}
	if want("tasks") && ctx.Err() == nil {
		if rep.Tasks, err = runTasksIdle(ctx, &c, p); err != nil {
			fail("tasks", err)
		}
	}
	if want("tracer") && ctx.Err() == nil {
		if rep.Tracer, err = runTracer(ctx, &c, p); err != nil {
			fail("tracer", err)
		}
	}
	if want("long") && ctx.Err() == nil {
		if rep.Long, err = runLong(ctx, &c, p); err != nil {
			fail("long", err)
		}
	}
	if want("lowrate") && ctx.Err() == nil {
		if rep.LowRate, err = runLowRate(ctx, &c, p); err != nil {
			fail("lowrate", err)
		}
	}
	if ctx.Err() != nil {
		fail("run", ctx.Err())
	}
	rep.Elapsed = time.Since(rep.Started)
	rep.LoadAfter = loadAvg()
	if len(rep.Errors) > 0 {
		return rep, fmt.Errorf("bench: %s", strings.Join(rep.Errors, "; "))
	}
	return rep, nil
}

type progress struct {
	w     io.Writer
	start time.Time
}

func (p *progress) logf(format string, args ...any) {
	if p.w != nil {
		fmt.Fprintf(p.w, "[%6.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
	}
}

// loadAvg returns the 1-minute load average ("?" where unknown).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// machine describes where the run happened.
func machine() string {
	cpu := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	s := fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	if cpu != "" {
		s += " (" + cpu + ")"
	}
	return s + ", " + runtime.Version()
}
