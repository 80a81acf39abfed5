package bus

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// LoadHistory returns a Session's records for resuming it: from its Trace
// files when home has them (the last two files, which always hold the last
// completed compaction and everything after it, each up to what the tracer
// recorded), then the stream after the tracer's position; from the stream
// alone otherwise. Malformed Trace lines (a torn tail, a garbage line) are
// skipped and counted in bad; when there are any and the stream still holds
// the whole Session, the stream is used instead.
func LoadHistory(ctx context.Context, js jetstream.JetStream, home, sessionID string) (msgs []omni.Message, lastSeq uint64, bad int, err error) {
	if home != "" {
		pos, ok, perr := omni.ReadTracePos(home, sessionID)
		if perr == nil && ok && pos.Seq > 0 {
			files, ferr := omni.TraceFiles(home, sessionID)
			if ferr == nil && len(files) > 0 {
				var usable []string
				for _, f := range files {
					usable = append(usable, f)
					if f == pos.File {
						break
					}
				}
				if len(usable) > 2 {
					usable = usable[len(usable)-2:]
				}
				for _, f := range usable {
					limit := int64(-1)
					if f == pos.File {
						limit = pos.Size
					}
					got, skipped, rerr := readTraceFile(f, limit)
					if rerr != nil {
						return nil, 0, 0, rerr
					}
					msgs = append(msgs, got...)
					bad += skipped
				}
				if bad > 0 {
					// A damaged Trace: prefer the stream when it still
					// holds the Session from its head.
					if all, last, sbad, serr := History(ctx, js, sessionID); serr == nil && len(all) > 0 && all[0].Type == omni.KindSessionMeta {
						return all, last, sbad, nil
					}
				}
				return historyFrom(ctx, js, sessionID, pos.Seq+1, msgs, pos.Seq, bad)
			}
		}
	}
	return History(ctx, js, sessionID)
}

func readTraceFile(path string, limit int64) ([]omni.Message, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("bus: open trace: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if limit >= 0 {
		b, err := io.ReadAll(io.LimitReader(f, limit))
		if err != nil {
			return nil, 0, fmt.Errorf("bus: read trace: %w", err)
		}
		r = bytes.NewReader(b)
	}
	msgs, skipped, err := omni.ReadTrace(r)
	if err != nil {
		return nil, 0, fmt.Errorf("bus: read trace %s: %w", path, err)
	}
	return msgs, len(skipped), nil
}
