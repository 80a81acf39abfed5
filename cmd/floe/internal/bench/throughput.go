package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// ThroughputResult compares the pipeline with bare JetStream on the same
// bytes: partials per second from the first to the last arrival, the median
// of Runs runs.
type ThroughputResult struct {
	Partials  int     // partials per run
	AvgBytes  float64 // mean encoded size of one partial
	Blocks    int     // text blocks per run (each one complete message in the Trace)
	Runs      int
	Bare      float64 // async publish → ordered consumer (no HTTP)
	DirectSSE float64 // async publish → gateway → SSE client
	EngineSSE float64 // engine (scripted model) → gateway → SSE client
	// EngineTrace counts until the tracer's position covers the request's
	// request_end: every partial's content is in the Trace file (as the
	// Blocks complete messages; partials themselves are never traced).
	EngineTrace float64
	// FirstPartial is the median time from POST …/tasks to the first partial
	// at the SSE client (queue, engine pickup, context load, tool list,
	// session_meta, request_begin).
	FirstPartial time.Duration
	// DirectReconnects and EngineReconnects count, over all runs, the times
	// the gateway disconnected the SSE client as too slow (its buffer of
	// 1024 events full) and the client resumed with Last-Event-ID; the
	// rates include those resumes.
	DirectReconnects, EngineReconnects int
	// Spread is the lowest and highest rate of each path over the runs.
	Spread map[string][2]float64
	// Ratios is engine→SSE ÷ bare of each run (the two ran back to back).
	Ratios []float64
}

// spread returns the lowest and highest of xs.
func spread(xs []float64) [2]float64 {
	if len(xs) == 0 {
		return [2]float64{}
	}
	return [2]float64{slices.Min(xs), slices.Max(xs)}
}

const (
	fragment      = "some streamed words " // one delta: 20 characters, as BenchmarkEnginePathPartials
	chunksPerText = 1000                   // deltas per text block
)

func runThroughput(ctx context.Context, c *Config, p *progress) (*ThroughputResult, error) {
	e, err := startEnv(ctx, c.root, "throughput", true, c.Log)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	blocks := max(c.Partials/chunksPerText, 1)
	ref, err := writeScript(e.home, blocks)
	if err != nil {
		return nil, err
	}
	res := &ThroughputResult{Blocks: blocks, Runs: c.Runs}
	var bare, direct, engSSE, engTrace, first []float64
	for i := range c.Runs {
		p.logf("throughput run %d/%d: engine → SSE + Trace", i+1, c.Runs)
		r, err := engineRun(ctx, e, ref)
		if err != nil {
			return nil, err
		}
		res.Partials = len(r.payloads)
		total := 0
		for _, b := range r.payloads {
			total += len(b)
		}
		res.AvgBytes = float64(total) / float64(len(r.payloads))
		engSSE = append(engSSE, r.sse)
		res.EngineReconnects += r.reconnects
		engTrace = append(engTrace, r.trace)
		first = append(first, r.first.Seconds())

		p.logf("throughput run %d/%d: bare JetStream", i+1, c.Runs)
		b, err := bareRun(ctx, e, r.payloads)
		if err != nil {
			return nil, err
		}
		bare = append(bare, b)

		p.logf("throughput run %d/%d: direct publish → SSE", i+1, c.Runs)
		d, dr, err := directRun(ctx, e, r.payloads)
		if err != nil {
			return nil, err
		}
		direct = append(direct, d)
		res.DirectReconnects += dr
	}
	res.Bare, res.DirectSSE = median(bare), median(direct)
	res.EngineSSE, res.EngineTrace = median(engSSE), median(engTrace)
	res.Spread = map[string][2]float64{"bare": spread(bare), "direct": spread(direct), "engineSSE": spread(engSSE), "engineTrace": spread(engTrace)}
	for i := range bare {
		res.Ratios = append(res.Ratios, engSSE[i]/bare[i])
	}
	res.FirstPartial = time.Duration(median(first) * float64(time.Second))
	return res, nil
}

// writeScript writes a scripted model of one request streaming blocks text
// blocks of chunksPerText deltas each, and returns its model reference.
func writeScript(home string, blocks int) (string, error) {
	type step struct {
		Text   string `json:"text"`
		Chunks int    `json:"chunks"`
	}
	text := strings.Repeat(fragment, chunksPerText)
	steps := make([]step, blocks)
	for i := range steps {
		steps[i] = step{Text: text, Chunks: chunksPerText}
	}
	script := map[string]any{
		"requests": []any{map[string]any{
			"steps": steps,
			// Small enough that no context compaction follows the Task
			// (the window of a scripted model is 128 000 tokens).
			"usage": map[string]int{"output": 2000, "total": 2500},
		}},
		"after_last": "fail",
	}
	b, err := json.Marshal(script)
	if err != nil {
		return "", err
	}
	path := filepath.Join(home, "stream-script.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", fmt.Errorf("bench: write script: %w", err)
	}
	return "scripted:" + path, nil
}

type engineRunResult struct {
	reconnects int      // slow-client disconnects the SSE client resumed from
	payloads   [][]byte // the partials' bytes as the SSE client got them
	sse, trace float64  // partials/s
	first      time.Duration
}

var (
	partialMark    = []byte(`"type":"partial_`)
	requestEndMark = []byte(`"type":"request_end"`)
	idleMark       = []byte(`"state":"idle"`)
	taskIDMark     = []byte(`"taskId":"`)
)

// engineRun runs one Task of the scripted model with one SSE client
// attached and the tracer writing, and times both.
func engineRun(ctx context.Context, e *env, ref string) (*engineRunResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	sess, err := e.api.CreateSession(ctx, client.CreateSession{Model: ref})
	if err != nil {
		return nil, fmt.Errorf("bench: create session: %w", err)
	}
	conn, err := dialSSE(ctx, e.addr, sess.ID, 64<<10)
	if err != nil {
		return nil, err
	}
	defer conn.close()
	stop := context.AfterFunc(ctx, conn.close)
	defer stop()
	if _, err := conn.next(); err != nil { // the task_state snapshot: live from here
		return nil, fmt.Errorf("bench: snapshot: %w", err)
	}

	var (
		payloads      [][]byte
		tFirst, tLast time.Time
		endSeq        atomic.Uint64
		endSeen       = make(chan struct{})
		readErr       error
		readDone      = make(chan struct{})
	)
	var reconnects int
	go func() {
		defer close(readDone)
		for {
			ev, err := conn.nextResuming(ctx, &reconnects)
			if err != nil {
				readErr = fmt.Errorf("bench: engine run stream ended early (%d reconnects): %w", reconnects, err)
				return
			}
			now := time.Now()
			switch {
			case ev.server:
				if bytes.Contains(ev.data, idleMark) && bytes.Contains(ev.data, taskIDMark) {
					return
				}
			case bytes.Contains(ev.data, partialMark):
				if tFirst.IsZero() {
					tFirst = now
				}
				tLast = now
				payloads = append(payloads, append([]byte(nil), ev.data...))
			case bytes.Contains(ev.data, requestEndMark):
				if endSeq.Load() == 0 {
					endSeq.Store(ev.seq)
					close(endSeen)
				}
			}
		}
	}()

	// The Trace holds the request once the tracer's position passes its
	// request_end.
	var tTrace time.Time
	traceDone := make(chan error, 1)
	go func() {
		select {
		case <-endSeen:
		case <-ctx.Done():
			traceDone <- ctx.Err()
			return
		}
		for ctx.Err() == nil {
			pos, ok, err := trace.ReadPos(e.home, sess.ID)
			if err == nil && ok && pos.Seq >= endSeq.Load() {
				tTrace = time.Now()
				traceDone <- nil
				return
			}
			_ = retry.Sleep(ctx, time.Millisecond)
		}
		traceDone <- ctx.Err()
	}()

	submitted := time.Now()
	if _, err := e.api.SubmitTask(ctx, sess.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "stream"}}}); err != nil {
		return nil, fmt.Errorf("bench: submit task: %w", err)
	}
	<-readDone
	if readErr != nil {
		return nil, readErr
	}
	if err := <-traceDone; err != nil {
		return nil, fmt.Errorf("bench: waiting for the Trace: %w", err)
	}
	if len(payloads) < 2 {
		return nil, fmt.Errorf("bench: engine run streamed %d partials", len(payloads))
	}
	n := float64(len(payloads) - 1)
	return &engineRunResult{
		reconnects: reconnects,
		payloads:   payloads,
		sse:        n / tLast.Sub(tFirst).Seconds(),
		trace:      n / tTrace.Sub(tFirst).Seconds(),
		first:      tFirst.Sub(submitted),
	}, nil
}

// bareRun publishes payloads as the engine does (async, one connection) on
// a fresh Session's partial subject and reads them with an ordered consumer
// on another connection, pulling 256 at a time as the gateway's do.
func bareRun(ctx context.Context, e *env, payloads [][]byte) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	nc, err := e.st.Server.Connect(nats.Name("floe-bench-consumer"))
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	sid := newSessionID()
	subject := omni.SessionSubject(sid, omni.ClassPartial)
	cons, err := js.OrderedConsumer(ctx, omni.SessionsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return 0, fmt.Errorf("bench: bare consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return 0, fmt.Errorf("bench: bare consume: %w", err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	var tFirst, tLast time.Time
	var readErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; n < len(payloads); n++ {
			if _, err := it.Next(); err != nil {
				readErr = fmt.Errorf("bench: bare consumer after %d: %w", n, err)
				return
			}
			tLast = time.Now()
			if n == 0 {
				tFirst = tLast
			}
		}
	}()
	if err := publishAll(ctx, e, subject, payloads); err != nil {
		return 0, err
	}
	<-done
	if readErr != nil {
		return 0, readErr
	}
	return float64(len(payloads)-1) / tLast.Sub(tFirst).Seconds(), nil
}

// directRun publishes payloads on a gateway Session's partial subject, as
// bareRun does, and reads them through one SSE client.
func directRun(ctx context.Context, e *env, payloads [][]byte) (float64, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	sess, err := e.api.CreateSession(ctx, client.CreateSession{})
	if err != nil {
		return 0, 0, fmt.Errorf("bench: create session: %w", err)
	}
	conn, err := dialSSE(ctx, e.addr, sess.ID, 64<<10)
	if err != nil {
		return 0, 0, err
	}
	defer conn.close()
	stop := context.AfterFunc(ctx, conn.close)
	defer stop()
	if _, err := conn.next(); err != nil {
		return 0, 0, fmt.Errorf("bench: snapshot: %w", err)
	}
	var tFirst, tLast time.Time
	var readErr error
	var reconnects int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; n < len(payloads); {
			ev, err := conn.nextResuming(ctx, &reconnects)
			if err != nil {
				readErr = fmt.Errorf("bench: direct SSE after %d (%d reconnects): %w", n, reconnects, err)
				return
			}
			if ev.server {
				continue
			}
			tLast = time.Now()
			if n == 0 {
				tFirst = tLast
			}
			n++
		}
	}()
	if err := publishAll(ctx, e, omni.SessionSubject(sess.ID, omni.ClassPartial), payloads); err != nil {
		return 0, 0, err
	}
	<-done
	if readErr != nil {
		return 0, 0, readErr
	}
	return float64(len(payloads)-1) / tLast.Sub(tFirst).Seconds(), reconnects, nil
}

// maxReconnects bounds the resumes of one throughput client.
const maxReconnects = 1000

func publishAll(ctx context.Context, e *env, subject string, payloads [][]byte) error {
	for _, b := range payloads {
		m := nats.NewMsg(subject)
		m.Data = b
		if err := e.publishAsync(ctx, m); err != nil {
			return err
		}
	}
	return e.flush(ctx)
}

var sidSeq atomic.Uint32

// newSessionID returns a fresh valid Session id.
func newSessionID() string {
	return omni.NewSessionID(time.Now(), fmt.Sprintf("%08x", 0xbe000000|sidSeq.Add(1)))
}

// median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
