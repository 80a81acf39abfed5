package bus

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// RecordChange is one change of the Session record store seen by Watch:
// the record as stored, or Deleted when the key was removed. A nil
// *RecordChange on the channel marks the end of the initial values.
type RecordChange struct {
	ID      string
	Record  *omni.SessionRecord // nil when Deleted
	Deleted bool
}

// Watch delivers every current record, then nil, then every later change,
// in the bucket's order, until ctx ends; then it stops the watcher and
// closes the channel. A record that does not decode is skipped (as is
// one whose command policy cannot be read). Only the
// latest value of a key is sent on start (a key deleted before is sent as
// Deleted); a slow reader holds up only its own watcher.
func (s *Sessions) Watch(ctx context.Context) (<-chan *RecordChange, error) {
	w, err := s.kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("bus: watch sessions: %w", err)
	}
	out := make(chan *RecordChange, 64)
	go func() {
		defer close(out)
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				var c *RecordChange
				if e != nil {
					if !omni.ValidSessionID(e.Key()) {
						continue // a command policy (Sessions)
					}
					c = &RecordChange{ID: e.Key()}
					if e.Operation() != jetstream.KeyValuePut {
						c.Deleted = true
					} else {
						r, err := s.decode(ctx, e.Key(), e.Revision(), e.Value())
						if err != nil {
							continue
						}
						c.Record = r
					}
				}
				select {
				case out <- c:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}
