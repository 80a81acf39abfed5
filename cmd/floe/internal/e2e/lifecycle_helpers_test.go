package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
)

// lcEnv is an env whose whole stack (server, engine, tracer, runners) can be
// stopped and started again on the same home, as after a machine restart.
type lcEnv struct {
	*env
	o    envOpts
	once sync.Once
	halt func()
}

// lcStart starts the stack like start does, on home (a new temporary
// directory when empty). The embedded server keeps its store in
// $home/jetstream, so a second lcStart on the same home finds the streams,
// the Session records and the Traces of the first.
func lcStart(t *testing.T, home string, o envOpts) *lcEnv {
	t.Helper()
	if home == "" {
		home = t.TempDir()
	}
	env, halt := startOn(t, home, o)
	e := &lcEnv{env: env, o: o, halt: halt}
	t.Cleanup(e.stop)
	return e
}

// stop stops the runners, then the stack (services, connections, server).
func (e *lcEnv) stop() { e.once.Do(e.halt) }

// restart stops everything and starts a new stack on the same home.
func (e *lcEnv) restart() *lcEnv {
	e.t.Helper()
	e.stop()
	return lcStart(e.t, e.home, e.o)
}

// control sends a control request to whoever runs the Session's Task (core
// NATS request/reply, as the gateway does).
func (e *env) lcControl(sid, verb string, c omni.Control) (omni.ControlReply, error) {
	body, err := omni.Pack(&c)
	if err != nil {
		return omni.ControlReply{}, err
	}
	m, err := e.st.Conn.Request(omni.ControlSubject(sid, verb), body, 10*time.Second)
	if err != nil {
		return omni.ControlReply{}, err
	}
	var rep omni.ControlReply
	if err := omni.Unpack(m.Data, &rep); err != nil {
		return omni.ControlReply{}, err
	}
	return rep, nil
}

// mustControl is control that fails the test unless the engine said OK.
func (e *env) lcMustControl(sid, verb string, c omni.Control) {
	e.t.Helper()
	rep, err := e.lcControl(sid, verb, c)
	if err != nil {
		e.t.Fatalf("control %s on %s: %v", verb, sid, err)
	}
	if !rep.OK {
		e.t.Fatalf("control %s on %s: reply %+v", verb, sid, rep)
	}
}

// follow reads the Session's stream (classes, all when nil) from the start
// until until returns true for a message, and returns everything read.
func (e *env) lcFollow(sid string, classes []string, what string, until func(rec) bool) []rec {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []rec
	err := bus.FollowUntil(ctx, e.st.JS, sid, classes, 0, false, func(sm bus.StreamMsg) error {
		r := rec{seq: sm.Seq, class: sm.Class, raw: append([]byte(nil), sm.Data...)}
		if sm.Class == omni.ClassServer {
			if err := json.Unmarshal(sm.Data, &r.ev); err != nil {
				e.t.Errorf("bad server event %s: %v", sm.Data, err)
			}
		} else {
			m, err := omni.Decode(sm.Data)
			if err != nil {
				e.t.Errorf("undecodable message at %d: %v: %s", sm.Seq, err, sm.Data)
				return nil
			}
			r.msg = m
		}
		out = append(out, r)
		if until(r) {
			return bus.ErrStop
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("waiting for %s on %s: %v; got %v", what, sid, err, labels(out, noPartials))
	}
	return out
}

// all reads everything stored for the Session so far.
func (e *env) lcAll(sid string, classes []string) []rec {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []rec
	err := bus.FollowUntil(ctx, e.st.JS, sid, classes, 0, true, func(sm bus.StreamMsg) error {
		r := rec{seq: sm.Seq, class: sm.Class, raw: append([]byte(nil), sm.Data...)}
		if sm.Class == omni.ClassServer {
			_ = json.Unmarshal(sm.Data, &r.ev)
		} else if m, err := omni.Decode(sm.Data); err == nil {
			r.msg = m
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		e.t.Fatalf("reading %s: %v", sid, err)
	}
	return out
}

// traced waits until the tracer has written every Trace-class message the
// stream holds for the Session; false when there is none.
func (e *env) lcTraced(sid string) bool {
	e.t.Helper()
	var last uint64
	for _, r := range e.lcAll(sid, omni.TraceClasses) {
		last = r.seq
	}
	if last == 0 {
		return false
	}
	eventually(e.t, 30*time.Second, "the tracer to write "+sid, func() bool {
		p, ok, err := trace.ReadPos(e.home, sid)
		return err == nil && ok && p.Seq >= last
	})
	return true
}

// lcTraceFile is one Trace file: its raw lines and decoded records.
type lcTraceFile struct {
	path  string
	lines [][]byte
	msgs  []omni.Message
}

// trace waits until the tracer has written every Trace-class message the
// stream holds for the Session and returns its Trace files in order.
func (e *env) lcTrace(sid string) []lcTraceFile {
	e.t.Helper()
	if !e.lcTraced(sid) {
		return nil
	}
	paths, err := trace.Files(e.home, sid)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []lcTraceFile
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			e.t.Fatal(err)
		}
		tf := lcTraceFile{path: p}
		tf.lines = append(tf.lines, bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))...)
		msgs, skipped, err := trace.Read(bytes.NewReader(data))
		if err != nil || len(skipped) > 0 {
			e.t.Fatalf("trace %s: %v, skipped %v", p, err, skipped)
		}
		tf.msgs = msgs
		out = append(out, tf)
	}
	return out
}

// lcTraceMsgs joins the records of every Trace file.
func lcTraceMsgs(files []lcTraceFile) []omni.Message {
	var out []omni.Message
	for _, f := range files {
		out = append(out, f.msgs...)
	}
	return out
}

// lcMsgLabel labels a decoded OmniMessage as label does a stream record.
func lcMsgLabel(m omni.Message) string {
	return label(rec{class: omni.ClassOf(&m), msg: m})
}

func lcMsgLabels(ms []omni.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = lcMsgLabel(m)
	}
	return out
}

// lcAfter returns the records after the first one with label l (nil when none).
func lcAfter(rs []rec, l string) []rec {
	for i, r := range rs {
		if label(r) == l {
			return rs[i+1:]
		}
	}
	return nil
}

// lcRequireStatus fails unless the Task ended with want; it prints the stream.
func lcRequireStatus(t *testing.T, rs []rec, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("task status = %q, want %q; stream:\n%s", got, want, strings.Join(lcDescribe(rs), "\n"))
	}
}

// lcDescribe renders complete messages with a little content, for failures.
func lcDescribe(rs []rec) []string {
	var out []string
	for _, r := range rs {
		if r.class != omni.ClassServer && r.msg.IsPartial() {
			continue
		}
		l := fmt.Sprintf("%5d %-7s %s", r.seq, r.class, label(r))
		if r.class != omni.ClassServer {
			if c := r.msg.Payload.Content(); c != "" {
				l += fmt.Sprintf(" %.120q", c)
			}
			if r.msg.Payload.ErrorMessage != "" {
				l += fmt.Sprintf(" error=%.300q", r.msg.Payload.ErrorMessage)
			}
			if len(r.msg.Origin) > 0 {
				l += fmt.Sprintf(" origin=%v", r.msg.Origin)
			}
		} else if r.ev.Status != "" {
			l += " " + r.ev.Status
		}
		out = append(out, l)
	}
	return out
}

// lcNoFailedRequests fails when a request did not complete: that is how a
// scripted expect_last_user / expect_tool_outputs mismatch shows.
func lcNoFailedRequests(t *testing.T, rs []rec) {
	t.Helper()
	for _, r := range rs {
		if r.class == omni.ClassServer || r.msg.Payload.Type != omni.TypeRequestEnd {
			continue
		}
		if s := r.msg.Payload.Status; s != omni.StatusCompleted && s != omni.StatusAborted {
			t.Fatalf("request ended %s at seq %d: %s", s, r.seq, r.msg.Payload.ErrorMessage)
		}
	}
}

// lcOnlyClass keeps the records of one subject class.
func lcOnlyClass(class string) func(rec) bool {
	return func(r rec) bool { return r.class == class }
}

// lcSameLabels fails unless got equals want.
func lcSameLabels(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s =\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// lcUserTexts returns the user texts among msgs.
func lcUserTexts(ms []omni.Message) []string {
	var out []string
	for _, m := range ms {
		if m.Type == omni.KindModel && m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleUser {
			out = append(out, m.Payload.Text)
		}
	}
	return out
}

// lcContextOf is the model context the engine folds from records.
func lcContextOf(ms []omni.Message) []omni.Message { return engine.ModelContext(ms) }

// lcCtxLabels labels a model context with a little content, for comparisons:
// "user:<text>", "assistant:<text>", "tool_call:<id>", "out:<id>:<output>".
func lcCtxLabels(ms []omni.Message) []string {
	var out []string
	for _, m := range ms {
		p := &m.Payload
		switch p.Type {
		case omni.TypeText:
			out = append(out, p.Role+":"+p.Text)
		case omni.TypeThinking:
			out = append(out, "thinking:"+p.Thinking)
		case omni.TypeToolCall:
			out = append(out, "tool_call:"+p.ToolCallID)
		case omni.TypeToolCallOutput:
			out = append(out, "out:"+p.ToolCallID+":"+strings.TrimSpace(p.Output))
		default:
			out = append(out, p.Type)
		}
	}
	return out
}

// lcSameGroups fails unless got is the concatenation of groups, each group in
// any order (for messages whose relative order depends on timing, such as
// an approval_decision and the next tool_call of the LLM stream).
func lcSameGroups(t *testing.T, what string, got []string, groups ...[]string) {
	t.Helper()
	i := 0
	ok := true
	for _, g := range groups {
		if i+len(g) > len(got) {
			ok = false
			break
		}
		a := slices.Clone(got[i : i+len(g)])
		b := slices.Clone(g)
		slices.Sort(a)
		slices.Sort(b)
		if !slices.Equal(a, b) {
			ok = false
			break
		}
		i += len(g)
	}
	if !ok || i != len(got) {
		var want []string
		for _, g := range groups {
			want = append(want, strings.Join(g, " | "))
		}
		t.Fatalf("%s =\n  %s\nwant (groups in any inner order)\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// lcSeq makes single-element groups.
func lcSeq(ls ...string) [][]string {
	out := make([][]string, len(ls))
	for i, l := range ls {
		out[i] = []string{l}
	}
	return out
}

// lcGroups concatenates group lists.
func lcGroups(gs ...[][]string) [][]string {
	var out [][]string
	for _, g := range gs {
		out = append(out, g...)
	}
	return out
}

// lcWithout drops the records of one subject class.
func lcWithout(rs []rec, class string) []rec {
	var out []rec
	for _, r := range rs {
		if r.class != class {
			out = append(out, r)
		}
	}
	return out
}
