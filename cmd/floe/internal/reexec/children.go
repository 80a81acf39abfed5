package reexec

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
)

// Subagents replay (protocol.md §8): a run_subagent call of the replay
// creates a child Session as it did; the child inherits the replay's
// model and toolrunner, which serve it from the child's own record (its
// Trace, named by the recorded subagent pointer), and its approvals are
// answered from that record too. The k-th child a replayed Session
// creates is the k-th its record points to. Each child's new Trace is
// compared with its record like the Session's own.

// A Finder reads the Trace records of a recorded child Session.
type Finder func(sessionID string) ([]omni.Message, error)

// HomeFinder finds a child's Trace files under a $FLOE_HOME.
func HomeFinder(home string) Finder {
	return func(sid string) ([]omni.Message, error) {
		files, err := trace.Files(home, sid)
		if err != nil {
			return nil, err
		}
		return readAll(files)
	}
}

// DirFinder finds a child's Trace files beside a Trace file: in its
// directory (<child>_NNN.jsonl), else, when the file is in a
// $FLOE_HOME/traces/<date> directory, under that home.
func DirFinder(dir string) Finder {
	return func(sid string) ([]omni.Message, error) {
		files, err := filepath.Glob(filepath.Join(dir, sid+"_*.jsonl"))
		if err == nil && len(files) == 0 && filepath.Base(filepath.Dir(dir)) == "traces" {
			files, err = trace.Files(filepath.Dir(filepath.Dir(dir)), sid)
		}
		if err != nil {
			return nil, err
		}
		sort.Strings(files)
		return readAll(files)
	}
}

// pointers are the child Session ids of records' own subagent pointers,
// in order.
func pointers(records []omni.Message) []string {
	var out []string
	for i := range records {
		m := &records[i]
		if m.Type == omni.KindEvent && m.Payload.Type == omni.TypeSubagent && len(m.Origin) == 0 && m.Payload.SessionID != "" {
			out = append(out, m.Payload.SessionID)
		}
	}
	return out
}

// LoadChildren reads the records of every subagent child the record
// points to, and of their children, by recorded Session id. A child
// whose record find cannot read is an error naming it.
func LoadChildren(records []omni.Message, find Finder) (map[string][]omni.Message, error) {
	out := map[string][]omni.Message{}
	queue := pointers(records)
	for len(queue) > 0 {
		sid := queue[0]
		queue = queue[1:]
		if _, done := out[sid]; done {
			continue
		}
		recs, err := find(sid)
		if err == nil && len(recs) == 0 {
			err = os.ErrNotExist
		}
		if err != nil {
			return nil, fmt.Errorf("the record of subagent %s: %w", sid, err)
		}
		out[sid] = recs
		queue = append(queue, pointers(recs)...)
	}
	return out, nil
}

// childRecords maps the replay's child Sessions to their records.
type childRecords struct {
	pc      *pacer
	main    string                    // the replay's Session
	recMain string                    // the recorded Session's id
	recs    map[string][]omni.Message // by recorded child id
	recKids map[string][]string       // recorded Session → its children, in order

	mapped map[string]string // replay child → recorded child; under pc.mu
}

func newChildRecords(pc *pacer, main string, records []omni.Message, children map[string][]omni.Message) *childRecords {
	c := &childRecords{pc: pc, main: main, recs: children, recKids: map[string][]string{}, mapped: map[string]string{}}
	c.recMain = records[0].Payload.SessionID
	c.recKids[c.recMain] = pointers(records)
	for sid, recs := range children {
		c.recKids[sid] = pointers(recs)
	}
	return c
}

// of is the record of a replay child Session (nil for the replay's own
// Session, or a child the record has no record of). It waits (ten pacing
// bounds at most) for the replay to publish the pointer that names it.
func (c *childRecords) of(ctx context.Context, sid string) []omni.Message {
	if c == nil || sid == c.main || len(c.recs) == 0 {
		return nil
	}
	var rec string
	_ = c.pc.untilFor(ctx, 10*c.pc.bound, func() bool {
		rec = c.resolveLocked(sid)
		return rec != ""
	})
	if rec == "" {
		return nil
	}
	c.pc.ensure(sid) // its own children are named on its stream
	return c.recs[rec]
}

// resolveLocked maps sid to its recorded child by its parent's pointers
// ("" when not known yet); c.pc.mu is held.
func (c *childRecords) resolveLocked(sid string) string {
	if rec, ok := c.mapped[sid]; ok {
		return rec
	}
	for parent, kids := range c.pc.kids {
		recParent := c.recMain
		if parent != c.main {
			var ok bool
			if recParent, ok = c.mapped[parent]; !ok {
				continue
			}
		}
		for k, kid := range kids {
			if kid == sid && k < len(c.recKids[recParent]) {
				rec := c.recKids[recParent][k]
				c.mapped[sid] = rec
				return rec
			}
		}
	}
	return ""
}

// pairs are the replay's children and their recorded ids.
func (c *childRecords) pairs() map[string]string {
	c.pc.mu.Lock()
	defer c.pc.mu.Unlock()
	out := make(map[string]string, len(c.mapped))
	for k, v := range c.mapped {
		out[k] = v
	}
	return out
}
