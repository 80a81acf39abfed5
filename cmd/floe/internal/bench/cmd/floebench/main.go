// Command floebench runs Floe's benchmark (package bench) and prints the
// results as markdown; scripts/bench wraps it.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/cmd/floe/internal/bench"
)

func main() {
	// As early as possible: live heap is attributed from the heap profile.
	runtime.MemProfileRate = bench.MemProfileRate
	if store := os.Getenv(bench.BrokerEnv); store != "" {
		os.Exit(bench.RunBroker(store))
	}
	if format := os.Getenv(bench.ModelEnv); format != "" {
		os.Exit(bench.RunModel(format))
	}
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("floebench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "a shorter run (fewer Sessions, shorter latency shapes)")
	out := fs.String("out", "", "also write the markdown to this file")
	jsonOut := fs.String("json", "", "also write a machine-readable summary (JSON) to this file")
	only := fs.String("only", "", "comma-separated scenarios: throughput,otel,latency,resume,idle,tasks,tracer,long,lowrate (default all)")
	partials := fs.Int("partials", 0, "partials per throughput run (default 50000 quick, 100000 full)")
	rate := fs.Float64("rate", 0, "total publish rate of the latency scenarios, partials/s (default 2000)")
	idle := fs.Int("idle-sessions", 0, "idle Sessions to create (default 10000, quick 5000)")
	taskSessions := fs.Int("task-sessions", 0, "Sessions of the tasks scenario, one real Task each (default 1000)")
	longTasks := fs.Int("long-tasks", 0, "Tasks of the long scenario's one Session (default 2000)")
	sessions := fs.String("sessions", "", "comma-separated Session counts of the latency scenario (default 1,100,1000)")
	tracerSessions := fs.String("tracer-sessions", "", "comma-separated Session counts of the tracer scenario (default 100,10000)")
	command := fs.String("command", "", "the command line to print in the report (default the arguments)")
	verbose := fs.Bool("v", false, "show the services' warnings")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	longProfiles := fs.String("long-profiles", "", "write CPU profiles of the long scenario's early and late Tasks, in process and with the remote model, to this directory (not with --cpuprofile)")
	memProfile := fs.String("memprofile", "", "write a heap profile (allocations of the whole run) to this file")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	c := bench.Full()
	// The limit only stops a run that hangs: every scenario has its own
	// timeout, and a busy machine (several load-average points per core)
	// takes several times as long; a limit the run reaches would skip the
	// scenarios after it.
	limit := 45 * time.Minute
	if *quick {
		c, limit = bench.Quick(), 30*time.Minute
	}
	if *partials > 0 {
		c.Partials = *partials
	}
	if *rate > 0 {
		c.Rate = *rate
	}
	if *idle > 0 {
		c.IdleSessions = *idle
	}
	if *longTasks > 0 {
		c.LongTasks = *longTasks
	}
	if *longProfiles != "" {
		if *cpuProfile != "" {
			fmt.Fprintln(os.Stderr, "floebench: --long-profiles and --cpuprofile cannot both run")
			return 2
		}
		c.LongProfiles = *longProfiles
	}
	if *taskSessions > 0 {
		c.TaskSessions = *taskSessions
	}
	for _, l := range []struct {
		flag, value string
		to          *[]int
	}{{"sessions", *sessions, &c.Sessions}, {"tracer-sessions", *tracerSessions, &c.TracerSessions}} {
		if l.value == "" {
			continue
		}
		*l.to = nil
		for _, f := range strings.Split(l.value, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "floebench: --%s %q: want positive counts\n", l.flag, l.value)
				return 2
			}
			*l.to = append(*l.to, n)
		}
	}
	if *only != "" {
		c.Only = strings.Split(*only, ",")
	}
	c.Progress = os.Stderr
	c.Log = zerolog.Nop()
	if *verbose {
		c.Log = zerolog.New(os.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	}
	if *command == "" {
		*command = strings.Join(append([]string{"floebench"}, os.Args[1:]...), " ")
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	rep, err := bench.Run(ctx, c)
	if rep == nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *memProfile != "" {
		if f, err := os.Create(*memProfile); err == nil {
			pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
	var buf bytes.Buffer
	rep.Markdown(&buf, *command)
	os.Stdout.Write(buf.Bytes())
	if *out != "" {
		if werr := os.WriteFile(*out, buf.Bytes(), 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, werr)
			return 1
		}
		fmt.Fprintf(os.Stderr, "written to %s\n", *out)
	}
	if *jsonOut != "" {
		if werr := rep.WriteJSON(*jsonOut); werr != nil {
			fmt.Fprintln(os.Stderr, werr)
			return 1
		}
		fmt.Fprintf(os.Stderr, "summary written to %s\n", *jsonOut)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
