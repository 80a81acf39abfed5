package bench

import (
	"encoding/json"
	"os"
	"strconv"
)

// Summary is the machine-readable digest of one run (scripts/bench --json
// FILE): every figure from the same Report. A scenario that did not run
// leaves its keys out.
type Summary struct {
	ThroughputRatio    *float64           `json:"throughput_ratio,omitempty"` // engine → SSE ÷ bare JetStream (median of the per-run ratios)
	SSEIdleRSSKiB      *float64           `json:"sse_idle_rss_kib,omitempty"`
	SSEIdleGoroutines  *float64           `json:"sse_idle_goroutines,omitempty"`
	LatencyP99us       map[string]float64 `json:"latency_p99_us,omitempty"`      // by Session count
	BareLatencyP99us   map[string]float64 `json:"bare_latency_p99_us,omitempty"` // by Session count
	TracerRate100      *float64           `json:"tracer_rate_100,omitempty"`     // records/s
	TracerRate10000    *float64           `json:"tracer_rate_10000,omitempty"`
	Resume100kMs       *float64           `json:"resume_100k_ms,omitempty"`
	JSONDecode100kMs   *float64           `json:"json_decode_100k_ms,omitempty"`
	Resume100kAllocMiB *float64           `json:"resume_100k_alloc_mib,omitempty"`
	Trace100kMiB       *float64           `json:"trace_100k_mib,omitempty"`
	// IdleSessionRSSKiB is the RSS of both processes (Floe services,
	// nats-server) per idle Session after real Tasks, past the block-cache
	// expiry; IdleSessionFloeRSSKiB and IdleSessionNATSRSSKiB its two parts.
	IdleSessionRSSKiB     *float64 `json:"idle_session_rss_kib,omitempty"`
	IdleSessionFloeRSSKiB *float64 `json:"idle_session_floe_rss_kib,omitempty"`
	IdleSessionNATSRSSKiB *float64 `json:"idle_session_nats_rss_kib,omitempty"`
	// The same 10 s after the last Task, with the streams' block caches of
	// the last Tasks still held.
	IdleSessionRSS10sKiB     *float64 `json:"idle_session_rss_10s_kib,omitempty"`
	IdleSessionFloeRSS10sKiB *float64 `json:"idle_session_floe_rss_10s_kib,omitempty"`
	IdleSessionNATSRSS10sKiB *float64 `json:"idle_session_nats_rss_10s_kib,omitempty"`
	ConsumersAfterIdle       *int     `json:"consumers_after_idle,omitempty"`
	// OTelThroughputRatio is engine → SSE with OpenTelemetry exporting
	// every span to a local receiver ÷ with it off (median of the pairs).
	OTelThroughputRatio *float64 `json:"otel_throughput_ratio,omitempty"`
	// Issue 27, a long Session (the long scenario).
	// Time per Task at the end ÷ near the start, and the same of the Floe
	// process's CPU per Task, with the model a server in another process
	// over HTTP (openai wire format), as a deployment's is; that server's
	// CPU per Task early and late.
	LateTaskRatio          *float64 `json:"late_task_ratio,omitempty"`
	LateTaskCPURatio       *float64 `json:"late_task_cpu_ratio,omitempty"`
	EarlyTaskModelServerMs *float64 `json:"early_task_model_server_cpu_ms,omitempty"`
	LateTaskModelServerMs  *float64 `json:"late_task_model_server_cpu_ms,omitempty"`
	// late_task_ratio of the time less the model server's time answering.
	LateTaskLessModelRatio *float64 `json:"late_task_less_model_ratio,omitempty"`
	// The same two with the scripted model in the measured process (what
	// late_task_ratio and late_task_cpu_ratio were before 2026-12-03 21:00).
	LateTaskInProcRatio    *float64 `json:"late_task_inproc_ratio,omitempty"`
	LateTaskInProcCPURatio *float64 `json:"late_task_inproc_cpu_ratio,omitempty"`
	// The in-process ones without the scripted model's token estimate, and that
	// estimate's CPU in a late Task (the model's work, not Floe's).
	LateTaskFloeRatio    *float64 `json:"late_task_floe_ratio,omitempty"`
	LateTaskFloeCPURatio *float64 `json:"late_task_floe_cpu_ratio,omitempty"`
	LateTaskModelCPUMs   *float64 `json:"late_task_model_cpu_ms,omitempty"`
	HistoryWindowKiB     *float64 `json:"history_window_kib,omitempty"` // GET /messages?tailTasks=50
	HistoryWindowMs      *float64 `json:"history_window_ms,omitempty"`
	DiskPerTrace         *float64 `json:"disk_per_trace,omitempty"` // the home's bytes ÷ the Trace's
	// The same once an age retention has expired every message of
	// FLOE_SESSIONS (FLOE_RETENTION; the Traces keep everything).
	DiskPerTraceRetention *float64 `json:"disk_per_trace_retention,omitempty"`
	// TracerShareLowRate is one Session streaming 500 deltas/s: the
	// process's CPU with the tracer ÷ without it (the lowrate scenario).
	TracerShareLowRate *float64 `json:"tracer_share_low_rate,omitempty"`
	Errors             []string `json:"errors,omitempty"`
}

// Summary digests the report.
func (r *Report) Summary() Summary {
	f := func(v float64) *float64 { return &v }
	var s Summary
	if t := r.Throughput; t != nil && len(t.Ratios) > 0 {
		s.ThroughputRatio = f(median(t.Ratios))
	}
	if o := r.OTel; o != nil && len(o.Ratios) > 0 {
		s.OTelThroughputRatio = f(o.Ratio())
	}
	for _, l := range r.Latency {
		if s.LatencyP99us == nil {
			s.LatencyP99us, s.BareLatencyP99us = map[string]float64{}, map[string]float64{}
		}
		k := strconv.Itoa(l.Sessions)
		s.LatencyP99us[k] = float64(l.P99.Microseconds())
		s.BareLatencyP99us[k] = float64(l.BareP99.Microseconds())
		if d := l.IdleConnection; d != nil {
			s.SSEIdleRSSKiB, s.SSEIdleGoroutines = f(d.RSS/1024), f(d.Goroutines)
		}
	}
	for _, x := range r.Tracer {
		switch x.Sessions {
		case 100:
			s.TracerRate100 = f(x.Rate)
		case 10_000:
			s.TracerRate10000 = f(x.Rate)
		}
	}
	for _, x := range r.Resume {
		if x.Records == 100_000 {
			s.Resume100kMs = f(float64(x.Resume.Microseconds()) / 1000)
			s.JSONDecode100kMs = f(float64(x.JSONDecode.Microseconds()) / 1000)
			s.Resume100kAllocMiB = f(float64(x.Alloc) / (1 << 20))
			s.Trace100kMiB = f(float64(x.TraceBytes) / (1 << 20))
		}
	}
	if x := r.Tasks; x != nil {
		s.IdleSessionRSSKiB, s.IdleSessionRSS10sKiB = f(x.RSS()/1024), f(x.RSSAtWait()/1024)
		s.IdleSessionFloeRSSKiB, s.IdleSessionNATSRSSKiB = f(x.Mem.RSS/1024), f(x.Broker.RSS/1024)
		s.IdleSessionFloeRSS10sKiB, s.IdleSessionNATSRSS10sKiB = f(x.MemAtWait.RSS/1024), f(x.BrokerAtWait.RSS/1024)
		s.ConsumersAfterIdle = &x.ConsumersAfter
	}
	if x := r.Long; x != nil {
		s.LateTaskRatio, s.LateTaskCPURatio = f(x.TimeRatio()), f(x.CPURatio())
		s.EarlyTaskModelServerMs = f(float64(x.Remote.EarlyModelCPU.Microseconds()) / 1000)
		s.LateTaskModelServerMs = f(float64(x.Remote.LateModelCPU.Microseconds()) / 1000)
		s.LateTaskLessModelRatio = f(x.LessModelRatio())
		s.LateTaskInProcRatio, s.LateTaskInProcCPURatio = f(x.InProcRatio()), f(x.InProcCPURatio())
		s.LateTaskFloeRatio, s.LateTaskFloeCPURatio = f(x.FloeRatio()), f(x.FloeCPURatio())
		s.LateTaskModelCPUMs = f(float64(x.LateModelCPU.Microseconds()) / 1000)
		s.HistoryWindowKiB = f(float64(x.WindowBytes) / 1024)
		s.HistoryWindowMs = f(float64(x.Window.Microseconds()) / 1000)
		s.DiskPerTrace = f(x.DiskPerTrace())
		s.DiskPerTraceRetention = f(x.DiskPerTraceRetained())
	}
	if x := r.LowRate; x != nil {
		s.TracerShareLowRate = f(x.Share())
	}
	s.Errors = r.Errors
	return s
}

// WriteJSON writes the summary to path, indented.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r.Summary(), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
