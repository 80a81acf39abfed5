package tracefile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

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
	names, err := readDirNames(filepath.Join(s.home, "tracer"))
	if err != nil {
		return fmt.Errorf("tracefile: list positions: %w", err)
	}
	for _, name := range names {
		id, ok := strings.CutSuffix(name, ".pos")
		if !ok {
			continue
		}
		p, ok, err := trace.ReadPos(s.home, id)
		if err != nil {
			s.log.Warn().Err(err).Str("session_id", id).Msg("cannot read a position to clear it")
			continue
		}
		if !ok || p.Seq == 0 {
			continue
		}
		p.Seq = 0
		if err := trace.WritePos(s.home, id, p); err != nil {
			return fmt.Errorf("tracefile: %w", err)
		}
	}
	return nil
}

func readDirNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}
