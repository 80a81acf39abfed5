package tracefile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"floe.dev/pkg/trace"
)

// SetEpoch ties the recorded positions to one incarnation of the stream
// (epoch: anything that changes when FLOE_SESSIONS is re-created, such as
// its creation time). Sequences restart at 1 in a new stream, so positions
// recorded against an older one would make the Store skip a continuing
// Session's new records: when the epoch differs from the one in
// $home/tracer/epoch, SetEpoch forgets every Session in memory and rewrites
// every position with Seq 0 (keeping file and size: the Traces go on where
// they are), then records the new epoch. It must run before any record of
// the new stream is appended; redoing it after a crash half-way is
// harmless. changed is false when the epoch is the recorded one or none was
// recorded (a new home).
func (s *Store) SetEpoch(epoch string) (changed bool, err error) {
	path := filepath.Join(s.home, "tracer", "epoch")
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("tracefile: read epoch: %w", err)
	}
	old = bytes.TrimSpace(old)
	if string(old) == epoch {
		return false, nil
	}
	if len(old) > 0 {
		changed = true
		s.Reset()
		if err := s.clearSeqs(); err != nil {
			return false, err
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(epoch+"\n"), 0o644); err != nil {
		return false, fmt.Errorf("tracefile: write epoch: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return false, fmt.Errorf("tracefile: write epoch: %w", err)
	}
	return changed, nil
}

// clearSeqs rewrites every recorded position with Seq 0.
func (s *Store) clearSeqs() error {
	type entry struct {
		id string
		p  trace.Pos
	}
	var set []entry
	err := s.pos.Range(func(id string, p trace.Pos) error {
		if p.Seq != 0 {
			p.Seq = 0
			set = append(set, entry{id, p})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("tracefile: %w", err)
	}
	for _, e := range set {
		if err := s.pos.Put(e.id, e.p, nil); err != nil {
			return fmt.Errorf("tracefile: %w", err)
		}
	}
	return nil
}
