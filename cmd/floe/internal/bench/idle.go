package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// IdleResult is what an idle Session costs: one created through the API,
// with a finished short Task's messages in the stream (traced), and no
// client attached.
type IdleResult struct {
	Sessions       int
	MsgsPerSession int
	Mem            memDelta // per Session: the whole process (engine, tracer, toolrunner, gateway, nats-server)
	StreamBytes    float64  // per Session: FLOE_SESSIONS bytes
	KVBytes        float64  // per Session: floe_sessions bucket bytes
	TraceBytes     float64  // per Session: Trace file + position file
	Create         time.Duration
	Traced         time.Duration // from the first publish until the tracer had written everything
}

// idleMessages is what a Session that ran one short Task leaves in the
// stream: its Trace records and the two task_state server events.
func idleMessages(sid string) ([]*nats.Msg, error) {
	recs := []omni.Message{
		omni.SessionMeta(omni.Meta{SessionID: sid, Provider: "scripted", ModelID: "demo", ModelContextWindow: 128000,
			SystemPrompt: "You are Floe.", Workspace: "/home/dev/project"}),
		omni.ToolListReady(benchTools),
		omni.UserText("what is in this folder?"),
		omni.RequestBegin(),
		omni.Text(omni.RoleAssistant, "The folder holds a Go module with a README and two packages; nothing else stands out."),
		omni.TokenUsage(omni.Usage{Output: 24, Total: 1210}, omni.Usage{Output: 24, Total: 1210}),
		omni.RequestEnd(omni.StatusCompleted, "", 0, 0),
	}
	task := "task-" + sid[len(sid)-8:]
	server := func(ev omni.ServerEvent) *nats.Msg {
		b, _ := json.Marshal(ev)
		nm := nats.NewMsg(omni.SessionSubject(sid, omni.ClassServer))
		nm.Data = b
		return nm
	}
	// The server events go around the records, as the engine sends them.
	out := []*nats.Msg{server(omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateRunning, TaskID: task})}
	for i := range recs {
		nm, err := bus.SessionMsg(sid, &recs[i], "")
		if err != nil {
			return nil, err
		}
		out = append(out, nm)
	}
	out = append(out, server(omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: omni.StatusCompleted, TaskID: task}))
	return out, nil
}

// cacheExpiry is a little more than nats-server's file store block cache
// expiry (10 s): the "after" figure must not count blocks cached while the
// messages were being written.
const cacheExpiry = 11 * time.Second

func runIdle(ctx context.Context, c *Config, p *progress) (*IdleResult, error) {
	e, err := startEnv(ctx, c.root, "idle", true, c.Log)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	ctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	n := c.IdleSessions
	time.Sleep(time.Second) // let start-up settle
	streamBefore, kvBefore, err := busBytes(ctx, e)
	if err != nil {
		return nil, err
	}
	before := snapshot()

	p.logf("idle: creating %d Sessions through the API", n)
	t0 := time.Now()
	sids, err := createSessions(ctx, e, n)
	if err != nil {
		return nil, err
	}
	res := &IdleResult{Sessions: n, Create: time.Since(t0)}

	p.logf("idle: publishing their messages, waiting for the tracer")
	t0 = time.Now()
	for _, sid := range sids {
		msgs, err := idleMessages(sid)
		if err != nil {
			return nil, err
		}
		res.MsgsPerSession = len(msgs)
		for _, m := range msgs {
			if err := e.publishAsync(ctx, m); err != nil {
				return nil, err
			}
		}
	}
	if err := e.flush(ctx); err != nil {
		return nil, err
	}
	cons, err := e.js.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	if err != nil {
		return nil, fmt.Errorf("bench: tracer consumer: %w", err)
	}
	if err := waitFor(ctx, 5*time.Minute, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}); err != nil {
		return nil, fmt.Errorf("bench: waiting for the tracer: %w", err)
	}
	res.Traced = time.Since(t0)

	p.logf("idle: waiting %v for caches to expire, then measuring", cacheExpiry)
	time.Sleep(cacheExpiry)
	after := snapshot()
	res.Mem = deltaPer(before, after, n)
	streamAfter, kvAfter, err := busBytes(ctx, e)
	if err != nil {
		return nil, err
	}
	res.StreamBytes = float64(streamAfter-streamBefore) / float64(n)
	res.KVBytes = float64(kvAfter-kvBefore) / float64(n)
	var traceBytes int64
	for _, dir := range []string{filepath.Join(e.home, "traces"), filepath.Join(e.home, "tracer")} {
		_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if info, err := d.Info(); err == nil {
					traceBytes += info.Size()
				}
			}
			return nil
		})
	}
	res.TraceBytes = float64(traceBytes) / float64(n)
	return res, nil
}

// busBytes returns the stored bytes of FLOE_SESSIONS and of the Session
// bucket.
func busBytes(ctx context.Context, e *env) (stream, kv uint64, err error) {
	s, err := e.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return 0, 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	b, err := e.js.KeyValue(ctx, omni.SessionsBucket)
	if err != nil {
		return 0, 0, err
	}
	st, err := b.Status(ctx)
	if err != nil {
		return 0, 0, err
	}
	return info.State.Bytes, st.Bytes(), nil
}
