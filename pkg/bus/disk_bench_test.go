package bus_test

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/omni"
)

// BenchmarkSessionsDisk measures what FLOE_SESSIONS takes on disk per
// 1,000 Tasks of a long Session, with the layout's S2 compression and
// without: each Task as the engine stores it (the Prompt, an answer
// streamed in 12 partials, the complete answer, task_state running and
// idle), its partials purged at its end as FLOE_PARTIALS_KEEP=0 does, over
// enough Tasks to seal several 8 MiB blocks (nats-server compresses a
// block when it seals it; the one being written stays plain). Reported:
// disk KiB per 1,000 Tasks, and the same of the messages the stream
// still holds (its own accounting).
func BenchmarkSessionsDisk(b *testing.B) {
	for _, compress := range []bool{false, true} {
		b.Run(fmt.Sprintf("s2=%v", compress), func(b *testing.B) {
			for range b.N {
				disk, held := sessionsDisk(b, compress, 12_000)
				b.ReportMetric(disk/12, "disk-KiB/1000tasks")
				b.ReportMetric(held/12, "held-KiB/1000tasks")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

func sessionsDisk(b *testing.B, compress bool, tasks int) (diskKiB, heldKiB float64) {
	dir := b.TempDir()
	// The store's periodic sync compacts sealed blocks that are mostly
	// purged partials (and compresses them): every 2 min by default,
	// every second here, so the figure is that of a settled store.
	srv, err := embed.Start(embed.Options{StoreDir: dir, Listen: "127.0.0.1:0", SyncInterval: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := bus.SessionsStreamConfig(bus.Config{})
	if !compress {
		cfg.Compression = jetstream.NoCompression
	}
	st, err := js.CreateStream(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	sid := "session-2026-12-03-14-05-00-0a1b2c3d"
	answer := "The folder holds a Go module with a README and two packages; nothing else stands out."
	pub := func(class string, m omni.Message) {
		nm, err := bus.SessionMsgClass(sid, class, &m, "")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishMsgAsync(nm); err != nil {
			b.Fatal(err)
		}
	}
	server := func(state string, task int) {
		data := fmt.Appendf(nil, `{"type":"task_state","state":%q,"task_id":"task-%08d","timestamp":"2026-12-03T14:05:00.000Z"}`, state, task)
		if _, err := js.PublishAsync(omni.SessionSubject(sid, omni.ClassServer), data); err != nil {
			b.Fatal(err)
		}
	}
	for i := range tasks {
		server("running", i)
		pub(omni.ClassModel, omni.UserText(fmt.Sprintf("step %d: what is in this folder?", i)))
		pub(omni.ClassPartial, omni.Partial(omni.TypeText, omni.EventStart, "", "", ""))
		for j := 0; j < len(answer); j += 9 {
			pub(omni.ClassPartial, omni.Partial(omni.TypeText, omni.EventDelta, answer[j:min(j+9, len(answer))], "", ""))
		}
		pub(omni.ClassPartial, omni.Partial(omni.TypeText, omni.EventStop, "", "", ""))
		pub(omni.ClassModel, omni.Text(omni.RoleAssistant, answer))
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(omni.SessionSubject(sid, omni.ClassPartial))); err != nil {
			b.Fatal(err)
		}
		server("idle", i)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	info, err := st.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// Sealed blocks are compressed on a goroutine of their own and
	// compacted by the sync: wait until the disk stops shrinking.
	disk := storeBytes(dir)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(2 * time.Second)
		d := storeBytes(dir)
		if d == disk {
			break
		}
		disk = d
	}
	return float64(disk) / 1024, float64(info.State.Bytes) / 1024
}

// storeBytes is the disk the stream's message blocks take.
func storeBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.Contains(path, omni.SessionsStream) {
			if info, err := d.Info(); err == nil {
				if st, ok := info.Sys().(*syscall.Stat_t); ok {
					n += st.Blocks * 512
				} else {
					n += info.Size()
				}
			}
		}
		return nil
	})
	return n
}
