package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Markdown writes the report as markdown tables; command is the command
// line that produced it.
func (r *Report) Markdown(w io.Writer, command string) {
	c := r.Config
	fmt.Fprintf(w, "`%s` — %s, %s, %s in total, load average %s at the start and %s at the end.\n\n", command, r.Started.UTC().Format("2006-01-02 15:04 UTC"), machine(), r.Elapsed.Round(time.Second), r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(w, "One process (except where a scenario says otherwise): embedded nats-server (file storage, in-process connections), engine, toolrunner, tracer, gateway (HTTP on 127.0.0.1) and the benchmark's own clients share the cores; each scenario has a fresh FLOE_HOME. Compare the ratios; the absolute figures move with the machine.\n\n")

	if t := r.Throughput; t != nil {
		fmt.Fprintf(w, "**Pipeline throughput**: %s text partials of %.0f B (%d blocks of %d deltas), one SSE client, median of %d run(s); rate from the first to the last arrival.\n\n",
			num(t.Partials), t.AvgBytes, t.Blocks, chunksPerText, t.Runs)
		fmt.Fprintf(w, "| path | partials/s (median) | lowest – highest run | × bare JetStream |\n|---|---:|---:|---:|\n")
		row := func(name, key string, v float64) {
			sp := t.Spread[key]
			fmt.Fprintf(w, "| %s | %s | %s – %s | %.2f |\n", name, num(int(v+0.5)), num(int(sp[0]+0.5)), num(int(sp[1]+0.5)), v/t.Bare)
		}
		row("bare JetStream: async publish → ordered consumer, same bytes", "bare", t.Bare)
		row("async publish → gateway → SSE client", "direct", t.DirectSSE)
		row("engine (scripted model) → gateway → SSE client", "engineSSE", t.EngineSSE)
		row("engine → Trace file (tracer position past the request_end)", "engineTrace", t.EngineTrace)
		var rs []string
		for _, r := range t.Ratios {
			rs = append(rs, fmt.Sprintf("%.2f", r))
		}
		fmt.Fprintf(w, "\nEngine → SSE ÷ bare, run by run (each pair back to back): %s.", strings.Join(rs, ", "))
		fmt.Fprintf(w, " POST …/tasks → first partial at the SSE client: %s. Slow-client disconnects resumed with Last-Event-ID (included in the rates), over all runs: %d on the direct path, %d on the engine path.\n\n", dur(t.FirstPartial), t.DirectReconnects, t.EngineReconnects)
	}

	if o := r.OTel; o != nil {
		var rs []string
		for _, x := range o.Ratios {
			rs = append(rs, fmt.Sprintf("%.2f", x))
		}
		fmt.Fprintf(w, "**OpenTelemetry cost**: engine → SSE throughput of two Floes, one exporting every span and the GenAI metrics to a local OTLP/HTTP receiver, one with tracing off, %d pair(s) back to back.\n\n", o.Runs)
		fmt.Fprintf(w, "| tracing | partials/s (median) |\n|---|---:|\n| off | %s |\n| on (OTLP/HTTP to 127.0.0.1) | %s |\n\n", num(int(o.Off+0.5)), num(int(o.On+0.5)))
		fmt.Fprintf(w, "On ÷ off, pair by pair: %s (median %.2f). The receiver decoded %d spans in %d export requests.\n\n", strings.Join(rs, ", "), o.Ratio(), o.Spans, o.Requests)
	}

	if len(r.Latency) > 0 {
		fmt.Fprintf(w, "**Publish → SSE latency**: partials published as the engine publishes them (omni.Partial, async, one connection) on every Session round-robin at a fixed total rate, one SSE client per Session, after one second of warm-up at the same rate; latency = arrival at the client − stamp taken before publishing.\n\n")
		fmt.Fprintf(w, "| Sessions | rate per Session | total rate | partials | p50 | p99 | max | bare JetStream p50 | p99 | max | p99 ÷ bare p99 | opening the streams |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, l := range r.Latency {
			ratio := 0.0
			if l.BareP99 > 0 {
				ratio = float64(l.P99) / float64(l.BareP99)
			}
			fmt.Fprintf(w, "| %s | %s/s | %s/s | %s | %s | %s | %s | %s | %s | %s | %.2f | %s |\n", num(l.Sessions), rate(l.PerSession), num(int(l.Rate)), num(l.Messages),
				dur(l.P50), dur(l.P99), dur(l.Max), dur(l.BareP50), dur(l.BareP99), dur(l.BareMax), ratio, dur(l.Connect))
		}
		fmt.Fprintf(w, "\nThe gateway holds one consumer on FLOE_SESSIONS for all its SSE clients; the bare JetStream run that follows each shape uses one ordered consumer per Session.\n\n")
		for _, l := range r.Latency {
			if d := l.IdleConnection; d != nil {
				fmt.Fprintf(w, "**Per idle SSE connection** (%s streams open, one per Session, snapshot read, nothing flowing; the benchmark's client keeps only the socket; process delta after GC ÷ connections; heap split by allocating code from the heap profile, an estimate):\n\n", num(d.Units))
				fmt.Fprintf(w, "| RSS | Go heap | gateway (Floe code) | nats.go | nats-server | net/http, runtime | benchmark client | goroutine stacks | goroutines |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %.2f |\n\n", kib(d.RSS), kib(d.Heap),
					kib(d.ByOwner[ownerFloe]), kib(d.ByOwner[ownerClient]), kib(d.ByOwner[ownerServer]), kib(d.ByOwner[ownerOther]), kib(d.ByOwner[ownerBench]),
					kib(d.Stack), d.Goroutines)
			}
		}
	}

	if len(r.Resume) > 0 {
		fmt.Fprintf(w, "**Resume**: engine.ResumeContext, as an engine resuming the Session does: trace.Replay reads the Trace file up to the tracer's position, then the records after it from the stream (the last Task, %d records, still untraced; or none, a tracer that is caught up), and the fold takes each record as it is read; Trace in the page cache, median of %d runs. Records are a coding Session built with the omni builders: 20 per Task (prompt, thinking, text, two approved tool calls with 1.3 KB and 2 KB outputs, answer, token_usage and request_end per request).\n\n", tailRecords, c.ResumeRuns)
		fmt.Fprintf(w, "| records | of them in the stream only | Trace file | resume | records/s | context messages | allocated | ÷ file | encoding/json into []map[string]any: time / allocated | resume ÷ json |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, x := range r.Resume {
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %.2f | %s / %s | %.2f |\n", num(x.Records), x.StreamTail, mib(float64(x.TraceBytes)), dur(x.Resume),
				num(int(float64(x.Records)/x.Resume.Seconds())), num(x.ContextMsgs), mib(float64(x.Alloc)), float64(x.Alloc)/float64(x.TraceBytes),
				dur(x.JSONDecode), mib(float64(x.JSONAlloc)), x.Resume.Seconds()/x.JSONDecode.Seconds())
		}
		fmt.Fprintln(w)
	}

	if x := r.Idle; x != nil {
		d := x.Mem
		fmt.Fprintf(w, "**Idle Session**: %s Sessions created through the API (%s), each with a finished short Task in the stream (%d messages: 7 Trace records, 2 task_state events) and traced (%s); no client attached. An idle Session is its KV record, its stream messages and its Trace files: no service keeps anything for it in memory, so the process delta is nats-server's index of the new subjects and keys. Measured after GC, %v after the last write (past the file store's cache expiry); process delta ÷ Sessions:\n\n",
			num(x.Sessions), dur(x.Create), x.MsgsPerSession, dur(x.Traced), cacheExpiry)
		fmt.Fprintf(w, "| per idle Session | |\n|---|---:|\n")
		fmt.Fprintf(w, "| process RSS | %s |\n| Go heap (live) | %s |\n", kib(d.RSS), kib(d.Heap))
		fmt.Fprintf(w, "| … allocated by nats-server (heap-profile estimate) | %s |\n| … by nats.go | %s |\n| … by Floe services | %s |\n| … by net/http, runtime | %s |\n",
			kib(d.ByOwner[ownerServer]), kib(d.ByOwner[ownerClient]), kib(d.ByOwner[ownerFloe]), kib(d.ByOwner[ownerOther]))
		fmt.Fprintf(w, "| goroutines | %+.4f |\n", d.Goroutines)
		fmt.Fprintf(w, "| FLOE_SESSIONS bytes | %s |\n| Session record (floe_sessions KV) bytes | %s |\n| Trace + position file bytes | %s |\n\n",
			kib(x.StreamBytes), kib(x.KVBytes), kib(x.TraceBytes))
	}

	if x := r.Tasks; x != nil {
		d, w10, b, b10 := x.Mem, x.MemAtWait, x.Broker, x.BrokerAtWait
		fmt.Fprintf(w, "**Idle Session after a real Task**: %s Sessions created through the API, each running one Task through the engine (a scripted model answering one text; 8 at a time; %s in all), traced, no client attached. Two processes, as in a deployment: the Floe services (engine, toolrunner, tracer, gateway, and the benchmark's HTTP client) in one, nats-server in another, connected over loopback TCP. Each process's delta ÷ Sessions after GC, against a baseline taken after %s warm-up Sessions (so what a process holds whatever the Session count is in both), %v after the last Task and %v after it, when nats-server has dropped the block caches of the streams the last Tasks wrote (up to a block, 8 MiB for FLOE_SESSIONS, per stream, whatever the Session count):\n\n", num(x.Sessions), dur(x.Run), num(x.Warmup), x.Wait, settledWait)
		fmt.Fprintf(w, "| per idle Session | %v after | %v after |\n|---|---:|---:|\n", x.Wait, settledWait)
		fmt.Fprintf(w, "| RSS, both processes | %s | %s |\n| Floe services' process RSS | %s | %s |\n| … Go heap (live) | %s | %s |\n| … … Floe services | %s | %s |\n| … … nats.go | %s | %s |\n| … goroutines | %+.4f | %+.4f |\n| nats-server's process RSS | %s | %s |\n| … Go heap (live) | %s | %s |\n\n",
			kib(x.RSSAtWait()), kib(x.RSS()), kib(w10.RSS), kib(d.RSS), kib(w10.Heap), kib(d.Heap), kib(w10.ByOwner[ownerFloe]), kib(d.ByOwner[ownerFloe]),
			kib(w10.ByOwner[ownerClient]), kib(d.ByOwner[ownerClient]), w10.Goroutines, d.Goroutines, kib(b10.RSS), kib(b.RSS), kib(b10.Heap), kib(b.Heap))
		fmt.Fprintf(w, "Consumers on FLOE_SESSIONS: %d before, at most %d while the Tasks ran, %d %v after the last Task (the tracer's durable is one).\n\n", x.ConsumersBefore, x.ConsumersPeak, x.ConsumersAfter, x.Wait)
	}

	if len(r.Tracer) > 0 {
		fmt.Fprintf(w, "**Tracer**: new Sessions of one day, each starting with its session_meta, a partial published beside every record (two messages per record in every shape), published while the tracer runs, after the same warm-up (%d Sessions of 10 records, traced before the clock starts); the rate is from the first publish until the tracer's ack floor reaches the last message.\n\n", tracerWarmup)
		fmt.Fprintf(w, "| Sessions | records | order | elapsed | records/s | × the first row |\n|---:|---:|---|---:|---:|---:|\n")
		for _, x := range r.Tracer {
			order := "one Session after another"
			if x.Interleaved {
				order = "interleaved"
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %.2f |\n", num(x.Sessions), num(x.Records), order, dur(x.Elapsed), num(int(x.Rate)), x.Rate/r.Tracer[0].Rate)
		}
		fmt.Fprintln(w)
	}

	if x := r.Long; x != nil {
		fmt.Fprintf(w, "**Long Session** (scripted model in this process): one Session, %s Tasks one after another (a scripted model streams one text each; no compaction, so the context grows every Task), traced; per Task the time from submit to task_state idle on SSE and the process's CPU (every service and the embedded nats-server), median of %d. Early: Tasks 10–%d of a second Session, each followed by a late one, a Task of the long Session past its %s: side by side, under the same load. Sequential: the long Session's Tasks 10–%d and its last %d, minutes apart.\n\n", num(x.Tasks), longBucket, 10+longBucket-1, num(x.Tasks), 10+longBucket-1, longBucket)
		fmt.Fprintf(w, "| | early Task | late Task | late ÷ early | sequential: early | late | late ÷ early |\n|---|---:|---:|---:|---:|---:|---:|\n")
		fmt.Fprintf(w, "| time | %s | %s | %.2f | %s | %s | %.2f |\n| CPU | %s | %s | %.2f | %s | %s | %.2f |\n\n",
			dur(x.Early), dur(x.Late), x.InProcRatio(), dur(x.SeqEarly), dur(x.SeqLate), float64(x.SeqLate)/float64(x.SeqEarly),
			dur(x.EarlyCPU), dur(x.LateCPU), x.InProcCPURatio(), dur(x.SeqEarlyCPU), dur(x.SeqLateCPU), float64(x.SeqLateCPU)/float64(x.SeqEarlyCPU))
		fmt.Fprintf(w, "Of that CPU, the scripted model's own token estimate of each request (it reads the whole context, as a real model does on its side; in this process, so measured apart: engine.ScriptedModelCPU) took %s of CPU in an early Task and %s in a late one; without it a late Task's time ÷ an early one's is %s ÷ %s = %.2f, its CPU %s ÷ %s = %.2f.\n\n",
			dur(x.EarlyModelCPU), dur(x.LateModelCPU), dur(x.LateFloe), dur(x.EarlyFloe), x.FloeRatio(), dur(x.LateFloeCPU), dur(x.EarlyFloeCPU), x.FloeCPURatio())
		rm := x.Remote
		fmt.Fprintf(w, "With the model remote, as a deployment's (a fake OpenAI-compatible server in another process that reads each whole request, decodes the fields before its messages and streams the same answer; the engine's openai provider over HTTP): the same side-by-side Tasks in a Floe of their own. The CPU is this process's (engine, nats-server, tracer, gateway, toolrunner), the model server's apart.\n\n")
		fmt.Fprintf(w, "| remote model | early Task | late Task | late ÷ early |\n|---|---:|---:|---:|\n| time | %s | %s | **%.2f** |\n| Floe CPU | %s | %s | **%.2f** |\n| model server CPU | %s | %s | %.2f |\n| time less the model server's answering | %s | %s | %.2f |\n| of the time: the model server reading the body | %s | %s | %.2f |\n\n",
			dur(rm.Early), dur(rm.Late), x.TimeRatio(), dur(rm.EarlyCPU), dur(rm.LateCPU), x.CPURatio(), dur(rm.EarlyModelCPU), dur(rm.LateModelCPU), float64(rm.LateModelCPU)/float64(rm.EarlyModelCPU),
			dur(rm.EarlyFloe), dur(rm.LateFloe), x.LessModelRatio(), dur(rm.EarlyRead), dur(rm.LateRead), float64(rm.LateRead)/float64(rm.EarlyRead))
		fmt.Fprintf(w, "History: the newest 50 Tasks (GET /messages?tailTasks=50) %s in %s; the whole history %s in %s (median of 5). Disk: the home %s, its Traces %s (%.2f×); the JetStream store %s, where FLOE_SESSIONS's messages are %s and the snapshot bucket's %s; once an age retention (FLOE_RETENTION) has expired every message of FLOE_SESSIONS, the home %s (%.2f×).\n\n",
			kib(float64(x.WindowBytes)), dur(x.Window), kib(float64(x.WholeBytes)), dur(x.Whole), mib(float64(x.Disk)), mib(float64(x.TraceBytes)), x.DiskPerTrace(),
			mib(float64(x.Store)), mib(float64(x.SessionsBytes)), mib(float64(x.SnapshotBytes)), mib(float64(x.DiskRetained)), x.DiskPerTraceRetained())
	}

	if x := r.LowRate; x != nil {
		fmt.Fprintf(w, "**Low rate**: one Session whose Task streams %s text deltas through the engine (%.0f partials/s measured), in a Floe with the tracer and in one without, alternately, %d Tasks each; the process's CPU per Task (engine, embedded nats-server, idle gateway and toolrunner, the tracer when there is one), median.\n\n", num(x.Deltas), x.Rate, x.Runs)
		fmt.Fprintf(w, "| without the tracer | with it | with ÷ without |\n|---:|---:|---:|\n| %s | %s | %.2f |\n\n", dur(x.Without), dur(x.With), x.Share())
	}

	if len(r.Errors) > 0 {
		fmt.Fprintf(w, "**Failed**: %s\n\n", strings.Join(r.Errors, "; "))
	}
}

// num formats n with thin thousands separators.
func num(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString(" ")
		}
		b.WriteRune(ch)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func rate(v float64) string {
	if v >= 100 {
		return num(int(v + 0.5))
	}
	return fmt.Sprintf("%.3g", v)
}

func dur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
}

func kib(b float64) string {
	if math.Abs(b) < 1024 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.1f KiB", b/1024)
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
