package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"time"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
	"floe.dev/services/gateway/client"
)

// LongResult is what a long Session costs (issue 27): one Session given
// Tasks one after another through the engine (a scripted model answering
// each with one streamed text, no compaction, so the context grows with
// every Task), traced, each Task's partials purged at its end (the
// FLOE_PARTIALS_KEEP grace period taken as passed).
type LongResult struct {
	Tasks int
	// Early and Late are the median time per Task (submit → task_state
	// idle on SSE) and the process CPU per Task (every service of the Floe
	// and its embedded nats-server) of longBucket Tasks of a second,
	// short Session (its Tasks 10 on) and of as many more Tasks of the long
	// one after its Tasks, one of each in turn: the two figures are
	// measured side by side, under the same load on the machine.
	Early, Late       time.Duration
	EarlyCPU, LateCPU time.Duration
	// EarlyFloe, LateFloe, EarlyFloeCPU and LateFloeCPU are the same
	// medians of the time and the CPU per Task less what the scripted
	// model spent on its own token estimate (engine.ScriptedModelTime,
	// ScriptedModelCPU): it reads the whole request, as a real model does
	// on its side, so it grows with the context but is not Floe's.
	// EarlyModelCPU and LateModelCPU are its CPU's medians.
	EarlyFloe, LateFloe         time.Duration
	EarlyFloeCPU, LateFloeCPU   time.Duration
	EarlyModelCPU, LateModelCPU time.Duration
	// SeqEarly and SeqLate are the same of the long Session alone: its
	// Tasks 10 on and its last longBucket Tasks (minutes apart, so a
	// busy machine moves them).
	SeqEarly, SeqLate       time.Duration
	SeqEarlyCPU, SeqLateCPU time.Duration
	// Window is the Web App's opening call of the Session after the last
	// Task (GET /messages?tailTasks=50): its bytes and its median time
	// over loopback; Whole the same of the whole history.
	WindowBytes, WholeBytes int64
	Window, Whole           time.Duration
	// Disk is the FLOE_HOME's bytes (JetStream store and Traces) and
	// TraceBytes the Trace files' after the last Task is traced; Store the
	// JetStream store directory's, of which the streams' own accounting
	// says SessionsBytes are FLOE_SESSIONS's messages and SnapshotBytes
	// the context snapshot bucket's.
	Disk, TraceBytes, Store int64
	// DiskRetained is Disk once an age retention of FLOE_SESSIONS
	// (FLOE_RETENTION) has expired every message of the stream.
	DiskRetained                 int64
	SessionsBytes, SnapshotBytes uint64
	// Remote is the same Tasks with the model in another process, spoken
	// to over HTTP (runLongRemote): what a deployment sees. The figures
	// above are of the scripted model, in this process.
	Remote *longRemote
}

// TimeRatio is late_task_ratio: a late Task's time ÷ an early one's with
// the remote model (Remote).
func (r *LongResult) TimeRatio() float64 {
	return float64(r.Remote.Late) / float64(r.Remote.Early)
}

// CPURatio is late_task_cpu_ratio: the same of the CPU per Task of the
// Floe process (the model server's apart).
func (r *LongResult) CPURatio() float64 {
	return float64(r.Remote.LateCPU) / float64(r.Remote.EarlyCPU)
}

// LessModelRatio is late_task_less_model_ratio: TimeRatio of the time
// per Task less the model server's time answering (Remote.EarlyFloe,
// LateFloe).
func (r *LongResult) LessModelRatio() float64 {
	return float64(r.Remote.LateFloe) / float64(r.Remote.EarlyFloe)
}

// InProcRatio and InProcCPURatio are late_task_inproc_ratio and
// late_task_inproc_cpu_ratio: the same with the scripted model in the
// measured process (late_task_ratio and late_task_cpu_ratio before
// 2026-12-03 21:00).
func (r *LongResult) InProcRatio() float64 { return float64(r.Late) / float64(r.Early) }

func (r *LongResult) InProcCPURatio() float64 { return float64(r.LateCPU) / float64(r.EarlyCPU) }

// FloeRatio and FloeCPURatio are TimeRatio and CPURatio without the
// scripted model's token estimate.
func (r *LongResult) FloeRatio() float64 { return float64(r.LateFloe) / float64(r.EarlyFloe) }

func (r *LongResult) FloeCPURatio() float64 {
	return float64(r.LateFloeCPU) / float64(r.EarlyFloeCPU)
}

// DiskPerTrace is disk_per_trace: the home's bytes ÷ the Trace's.
func (r *LongResult) DiskPerTrace() float64 { return float64(r.Disk) / float64(r.TraceBytes) }

// DiskPerTraceRetained is disk_per_trace_retention: DiskRetained ÷ the
// Trace's bytes.
func (r *LongResult) DiskPerTraceRetained() float64 {
	return float64(r.DiskRetained) / float64(r.TraceBytes)
}

// longBucket is how many Tasks each of the early and late medians covers.
const longBucket = 50

func runLong(ctx context.Context, c *Config, p *progress) (*LongResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 25*time.Minute)
	defer cancel()
	res, err := runLongInProc(ctx, c, p)
	if err != nil {
		return nil, err
	}
	if res.Remote, err = runLongRemote(ctx, c, p, res.Tasks); err != nil {
		return nil, err
	}
	return res, nil
}

// runLongInProc is the long scenario with the scripted model in this
// process, and the history and disk figures.
func runLongInProc(ctx context.Context, c *Config, p *progress) (*LongResult, error) {
	// The grace period has passed for every Task (disk_per_trace is the
	// disk after it): partials are purged as each Task ends, and the
	// Sessions leave the stream once idle for longIdleKeep (a keep of 0
	// would purge and snapshot the long Session between its Tasks, which
	// the Task figures must not pay: a real keep is an hour).
	e, err := startEnvTuned(ctx, c.root, "long", true, "", func(o *stack.Options) {
		o.Engine.SetPartialsKeep(0)
		o.Engine.SetIdleKeep(longIdleKeep)
	}, c.Log)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	ref, err := writeAnswerScript(e.home)
	if err != nil {
		return nil, err
	}
	n := max(c.LongTasks, 10+2*longBucket)
	res := &LongResult{Tasks: n}
	s, err := e.api.CreateSession(ctx, client.CreateSession{Model: ref})
	if err != nil {
		return nil, fmt.Errorf("bench: create session: %w", err)
	}
	stream, err := e.api.Stream(ctx, s.ID, "")
	if err != nil {
		return nil, fmt.Errorf("bench: stream: %w", err)
	}
	// task returns the Task's time and the process's CPU meanwhile, and
	// the scripted model's part of each.
	type cost struct{ d, cpu, md, mcpu time.Duration }
	task := func(sid string, stream *client.Stream, i int) (cost, error) {
		t0, c0, m0, mc0 := time.Now(), processCPU(), engine.ScriptedModelTime(), engine.ScriptedModelCPU()
		id, err := e.api.SubmitTask(ctx, sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: fmt.Sprintf("step %d: what is in this folder?", i)}}})
		if err != nil {
			return cost{}, fmt.Errorf("bench: task %d: %w", i, err)
		}
		if err := untilIdle(ctx, stream, id); err != nil {
			return cost{}, fmt.Errorf("bench: task %d: %w", i, err)
		}
		return cost{time.Since(t0), processCPU() - c0, engine.ScriptedModelTime() - m0, engine.ScriptedModelCPU() - mc0}, nil
	}
	p.logf("long: %d Tasks in one Session", n)
	var times, cpus []time.Duration
	// The profiles cover more Tasks than the medians, for enough samples.
	span := min(4*longBucket, (n-10)/2)
	prof := bucketProfiler{dir: c.LongProfiles, spans: map[int]string{10: "long-early.prof", n - span: "long-late.prof"}, length: span}
	defer prof.stop()
	for i := range n {
		if err := prof.at(i); err != nil {
			return nil, err
		}
		c, err := task(s.ID, stream, i)
		if err != nil {
			return nil, err
		}
		times = append(times, c.d)
		cpus = append(cpus, c.cpu)
		if (i+1)%500 == 0 {
			p.logf("long: %d Tasks, the last took %v", i+1, times[i].Round(time.Microsecond))
		}
	}
	prof.stop()
	median := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	// Task 10 on: the first Tasks also pay for warming up (connections,
	// consumers, caches).
	res.SeqEarly, res.SeqEarlyCPU = median(times[10:10+longBucket]), median(cpus[10:10+longBucket])
	res.SeqLate, res.SeqLateCPU = median(times[n-longBucket:]), median(cpus[n-longBucket:])

	// Side by side: a short Session's Tasks 10 on and more of the long
	// one's, one of each in turn.
	short, err := e.api.CreateSession(ctx, client.CreateSession{Model: ref})
	if err != nil {
		return nil, fmt.Errorf("bench: create session: %w", err)
	}
	shortStream, err := e.api.Stream(ctx, short.ID, "")
	if err != nil {
		return nil, fmt.Errorf("bench: stream: %w", err)
	}
	// Of each bucket: time, CPU, the same less the model's, the model's CPU.
	var early, late [5][]time.Duration
	add := func(b *[5][]time.Duration, c cost) {
		for i, v := range []time.Duration{c.d, c.cpu, c.d - c.md, c.cpu - c.mcpu, c.mcpu} {
			b[i] = append(b[i], v)
		}
	}
	for i := range 10 + longBucket {
		c, err := task(short.ID, shortStream, i)
		if err != nil {
			return nil, err
		}
		if i < 10 {
			continue
		}
		add(&early, c)
		if c, err = task(s.ID, stream, n+i); err != nil {
			return nil, err
		}
		add(&late, c)
	}
	res.Early, res.EarlyCPU, res.EarlyFloe, res.EarlyFloeCPU, res.EarlyModelCPU = median(early[0]), median(early[1]), median(early[2]), median(early[3]), median(early[4])
	res.Late, res.LateCPU, res.LateFloe, res.LateFloeCPU, res.LateModelCPU = median(late[0]), median(late[1]), median(late[2]), median(late[3]), median(late[4])

	if err := tracerCaughtUp(ctx, e); err != nil {
		return nil, err
	}
	if res.WindowBytes, res.Window, err = timeGet(ctx, e, s.ID, "?tailTasks=50"); err != nil {
		return nil, err
	}
	if res.WholeBytes, res.Whole, err = timeGet(ctx, e, s.ID, ""); err != nil {
		return nil, err
	}
	// The idle purge (FLOE_IDLE_KEEP) has run for both Sessions.
	if err := sessionsPurged(ctx, e); err != nil {
		return nil, err
	}
	syncDisks()
	res.Disk = dirBytes(e.home)
	res.TraceBytes = dirBytes(filepath.Join(e.home, "traces"))
	res.Store = dirBytes(filepath.Join(e.home, "jetstream"))
	for _, dir := range []string{e.home, filepath.Join(e.home, "jetstream", "jetstream", "$G", "streams")} {
		if ents, err := os.ReadDir(dir); err == nil {
			for _, d := range ents {
				p.logf("long: %s %d bytes", d.Name(), dirBytes(filepath.Join(dir, d.Name())))
			}
		}
	}
	// Each file of the home over 4 KiB: its apparent size and the
	// blocks it takes (a block file being written is sparse or not).
	_ = filepath.WalkDir(e.home, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil && (info.Size() > 4096 || diskBytes(info) > 4096) {
			rel, _ := filepath.Rel(e.home, path)
			p.logf("long: file %s: %d bytes, %d on disk", rel, info.Size(), diskBytes(info))
		}
		return nil
	})
	for name, dst := range map[string]*uint64{omni.SessionsStream: &res.SessionsBytes, "KV_" + omni.SnapshotsBucket: &res.SnapshotBytes} {
		if st, err := e.js.Stream(ctx, name); err == nil {
			*dst = st.CachedInfo().State.Bytes
		}
	}
	// What each store was written and holds: a block being written keeps
	// every byte written to it (disk_per_trace's reason, operations.md).
	for _, name := range []string{omni.SessionsStream, "KV_" + omni.SessionsBucket, "KV_" + omni.SnapshotsBucket} {
		if st, err := e.js.Stream(ctx, name); err == nil {
			s := st.CachedInfo().State
			p.logf("long: %s: %d messages written, %d held in %d bytes", name, s.LastSeq, s.Msgs, s.Bytes)
		}
	}
	// The same home with an age retention (FLOE_RETENTION) that has
	// expired every message of the stream: what is left beside the
	// Traces is the buckets' blocks.
	if err := expireSessions(ctx, e); err != nil {
		return nil, err
	}
	syncDisks()
	res.DiskRetained = dirBytes(e.home)
	p.logf("long: with FLOE_SESSIONS expired by age: the home %d bytes, the store %d", res.DiskRetained, dirBytes(filepath.Join(e.home, "jetstream")))
	return res, nil
}

// longIdleKeep is FLOE_IDLE_KEEP of the long scenario's home: longer
// than the gap between two Tasks of a Session.
const longIdleKeep = 2 * time.Second

// sessionsPurged waits until the idle purge has removed every message of
// FLOE_SESSIONS (both Sessions are idle).
func sessionsPurged(ctx context.Context, e *env) error {
	st, err := e.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := waitFor(ctx, time.Minute, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}); err != nil {
		return fmt.Errorf("bench: idle Sessions still on the stream: %w", err)
	}
	return nil
}

// expireSessions gives FLOE_SESSIONS a max age of 2 s (its duplicate
// window 1 s) and waits until it holds no message.
func expireSessions(ctx context.Context, e *env) error {
	st, err := e.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxAge, cfg.Duplicates = 2*time.Second, time.Second
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bench: FLOE_SESSIONS max age: %w", err)
	}
	return waitFor(ctx, time.Minute, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
}

// untilIdle reads the Session's SSE stream until the Task's task_state
// idle.
func untilIdle(ctx context.Context, s *client.Stream, taskID string) error {
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		select {
		case ev, ok := <-s.C:
			if !ok {
				return fmt.Errorf("stream ended: %v", s.Err())
			}
			if ev.Event != client.EventServer {
				continue
			}
			var se omni.ServerEvent
			if json.Unmarshal(ev.Data, &se) == nil && se.Type == omni.ServerTaskState && se.State == omni.StateIdle && se.TaskID == taskID {
				return nil
			}
		case <-deadline.C:
			return fmt.Errorf("no task_state idle within a minute")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func tracerCaughtUp(ctx context.Context, e *env) error {
	cons, err := e.js.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	if err != nil {
		return fmt.Errorf("bench: tracer consumer: %w", err)
	}
	return waitFor(ctx, 2*time.Minute, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// timeGet fetches the Session's /messages with query 5 times and returns
// the answer's size and the median time.
func timeGet(ctx context.Context, e *env, sid, query string) (int64, time.Duration, error) {
	var times []time.Duration
	var size int64
	for range 5 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+"/api/sessions/"+sid+"/messages"+query, nil)
		if err != nil {
			return 0, 0, err
		}
		t0 := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, 0, fmt.Errorf("bench: messages%s: %w", query, err)
		}
		size, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return 0, 0, fmt.Errorf("bench: messages%s: %s %v", query, resp.Status, err)
		}
		times = append(times, time.Since(t0))
	}
	slices.Sort(times)
	return size, times[len(times)/2], nil
}

// dirBytes is the disk taken by the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += diskBytes(info)
			}
		}
		return nil
	})
	return n
}

// bucketProfiler writes a CPU profile of each span of Tasks: spans maps
// the first Task of a span to its file in dir (no dir: none).
type bucketProfiler struct {
	dir    string
	spans  map[int]string
	length int
	f      *os.File
	end    int
}

// at is called before Task i.
func (b *bucketProfiler) at(i int) error {
	if b.dir == "" {
		return nil
	}
	if b.f != nil && i == b.end {
		b.stop()
	}
	name, ok := b.spans[i]
	if !ok || b.f != nil {
		return nil
	}
	f, err := os.Create(filepath.Join(b.dir, name))
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: profile %s: %w", name, err)
	}
	b.f, b.end = f, i+b.length
	return nil
}

func (b *bucketProfiler) stop() {
	if b.f != nil {
		pprof.StopCPUProfile()
		b.f.Close()
		b.f = nil
	}
}

// longRemote is the long scenario with the model remote, as a
// deployment's is: the engine's openai provider sends each request over
// HTTP to a fake model in a child process (startModel), which reads and
// decodes the whole request and streams the same answer. The CPU per Task
// is this process's (engine, nats-server, tracer, gateway, toolrunner);
// the model server's is measured apart.
type longRemote struct {
	Early, Late                 time.Duration
	EarlyCPU, LateCPU           time.Duration
	EarlyModelCPU, LateModelCPU time.Duration
	// EarlyFloe and LateFloe are the time per Task less the model
	// server's time answering its request (modelBusy), medians.
	EarlyFloe, LateFloe time.Duration
	// EarlyRead and LateRead are the model server's time reading the
	// request body (modelRead), medians: its transfer over loopback.
	EarlyRead, LateRead time.Duration
}

func runLongRemote(ctx context.Context, c *Config, p *progress, n int) (*longRemote, error) {
	model, err := startModel(ctx)
	if err != nil {
		return nil, err
	}
	defer model.stop()
	e, err := startEnvTuned(ctx, c.root, "long-remote", true, "", func(o *stack.Options) {
		o.Engine.SetPartialsKeep(0)
		o.Engine.Providers.OpenAIBaseURL, o.Engine.Providers.OpenAIAPIKey = model.url, "bench"
	}, c.Log)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	const ref = "openai:bench-model"
	open := func() (string, *client.Stream, error) {
		s, err := e.api.CreateSession(ctx, client.CreateSession{Model: ref})
		if err != nil {
			return "", nil, fmt.Errorf("bench: create session: %w", err)
		}
		st, err := e.api.Stream(ctx, s.ID, "")
		if err != nil {
			return "", nil, fmt.Errorf("bench: stream: %w", err)
		}
		return s.ID, st, nil
	}
	type cost struct{ d, cpu, mcpu, mbusy, mread time.Duration }
	task := func(sid string, stream *client.Stream, i int) (cost, error) {
		// The model server's CPU is asked outside the window this
		// process's is measured in.
		m0, b0, r0, err := model.cpu()
		if err != nil {
			return cost{}, err
		}
		t0, c0 := time.Now(), processCPU()
		id, err := e.api.SubmitTask(ctx, sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: fmt.Sprintf("step %d: what is in this folder?", i)}}})
		if err != nil {
			return cost{}, fmt.Errorf("bench: task %d: %w", i, err)
		}
		if err := untilIdle(ctx, stream, id); err != nil {
			return cost{}, fmt.Errorf("bench: task %d: %w", i, err)
		}
		k := cost{d: time.Since(t0), cpu: processCPU() - c0}
		m1, b1, r1, err := model.cpu()
		k.mcpu, k.mbusy, k.mread = m1-m0, b1-b0, r1-r0
		return k, err
	}
	sid, stream, err := open()
	if err != nil {
		return nil, err
	}
	p.logf("long, remote model: %d Tasks in one Session", n)
	span := min(4*longBucket, (n-10)/2)
	prof := bucketProfiler{dir: c.LongProfiles, spans: map[int]string{10: "long-remote-early.prof", n - span: "long-remote-late.prof"}, length: span}
	defer prof.stop()
	for i := range n {
		if err := prof.at(i); err != nil {
			return nil, err
		}
		k, err := task(sid, stream, i)
		if err != nil {
			return nil, err
		}
		if (i+1)%500 == 0 {
			p.logf("long, remote model: %d Tasks, the last took %v (model server %v CPU)", i+1, k.d.Round(time.Microsecond), k.mcpu.Round(time.Microsecond))
		}
	}
	prof.stop()
	short, shortStream, err := open()
	if err != nil {
		return nil, err
	}
	var early, late [5][]time.Duration
	add := func(b *[5][]time.Duration, k cost) {
		for i, v := range []time.Duration{k.d, k.cpu, k.mcpu, k.d - k.mbusy, k.mread} {
			b[i] = append(b[i], v)
		}
	}
	for i := range 10 + longBucket {
		k, err := task(short, shortStream, i)
		if err != nil {
			return nil, err
		}
		if i < 10 {
			continue
		}
		add(&early, k)
		if k, err = task(sid, stream, n+i); err != nil {
			return nil, err
		}
		add(&late, k)
	}
	return &longRemote{
		Early: medianOf(early[0]), EarlyCPU: medianOf(early[1]), EarlyModelCPU: medianOf(early[2]), EarlyFloe: medianOf(early[3]), EarlyRead: medianOf(early[4]),
		Late: medianOf(late[0]), LateCPU: medianOf(late[1]), LateModelCPU: medianOf(late[2]), LateFloe: medianOf(late[3]), LateRead: medianOf(late[4]),
	}, nil
}

func medianOf(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}
