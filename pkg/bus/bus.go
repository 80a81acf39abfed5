// Package bus sets up Floe's JetStream layout (the FLOE_SESSIONS stream, the
// task and tool work queues, the Session KV bucket) and holds the small
// helpers every service uses to talk over it: publishing OmniMessages on a
// Session's subjects, packing internal payloads, and Session records.
package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// Config is the JetStream layout's tunables.
type Config struct {
	// MaxAge and MaxBytes bound FLOE_SESSIONS retention (0 = unlimited).
	MaxAge   time.Duration
	MaxBytes int64
	// Memory uses memory storage (tests); the default is file storage.
	Memory bool
	// Replicas for every stream and bucket (1 on a single server, 3 on a cluster).
	Replicas int
	// MaxConsumers bounds FLOE_SESSIONS consumers: one per SSE client,
	// running Task and tracer (default 10000; nats-server's own default of
	// 1000 per stream would cap a gateway at about 1000 SSE clients).
	MaxConsumers int
	// DuplicateWindow is how long Nats-Msg-Id de-duplication remembers ids
	// (default 10 min: longer than any tool heartbeat timeout).
	DuplicateWindow time.Duration
}

func (c Config) storage() jetstream.StorageType {
	if c.Memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// compression is the stream compression of the layout's growing streams:
// S2 on disk. nats-server compresses a message block when it is full (8 MiB
// for FLOE_SESSIONS, 4 MiB for a bucket) and again when it compacts one;
// the block being written stays plain, so a small home does not shrink.
func (c Config) compression() jetstream.StoreCompression {
	if c.Memory {
		return jetstream.NoCompression
	}
	return jetstream.S2Compression
}

func (c Config) replicas() int {
	if c.Replicas <= 0 {
		return 1
	}
	return c.Replicas
}

// SessionsStreamConfig returns the FLOE_SESSIONS stream configuration.
func SessionsStreamConfig(c Config) jetstream.StreamConfig {
	dup := c.DuplicateWindow
	if dup <= 0 {
		dup = 10 * time.Minute
	}
	if c.MaxAge > 0 && dup > c.MaxAge {
		dup = c.MaxAge
	}
	maxc := c.MaxConsumers
	if maxc <= 0 {
		maxc = 10_000
	}
	return jetstream.StreamConfig{
		Name:         omni.SessionsStream,
		Description:  "Floe Session messages; the sequence is the stream order",
		Subjects:     []string{omni.SessionSubjects},
		Retention:    jetstream.LimitsPolicy,
		Storage:      c.storage(),
		Replicas:     c.replicas(),
		MaxAge:       c.MaxAge,
		MaxBytes:     c.MaxBytes,
		Duplicates:   dup,
		MaxConsumers: maxc,
		AllowDirect:  true,
		Compression:  c.compression(),
		// Fast batch publishing: the ordered publisher (pkg/bus/publish).
		AllowBatchPublish: true,
		Discard:           jetstream.DiscardOld,
	}
}

// Setup creates or updates every stream and bucket Floe uses and returns the
// Session record store.
func Setup(ctx context.Context, js jetstream.JetStream, c Config) (*Sessions, error) {
	for _, sc := range streamConfigs(c) {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return nil, fmt.Errorf("bus: create stream %s: %w", sc.Name, err)
		}
	}
	return setupBucket(ctx, js, c)
}

// Ensure is Setup for a service started with setup on (`floe serve`,
// `floe run`): it creates what is missing with c, and leaves what exists to
// its owner (`floe setup`, or the first start): the retention, duplicate
// window, consumer limit and replicas of an existing stream are never
// rewritten. It reports each setting of c the live layout disagrees with,
// for the caller to log. Only capabilities the services need are turned
// on in an existing stream (batched publishing, direct get).
func Ensure(ctx context.Context, js jetstream.JetStream, c Config) (*Sessions, []string, error) {
	var diffs []string
	for _, want := range streamConfigs(c) {
		st, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if _, err := js.CreateStream(ctx, want); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				return nil, nil, fmt.Errorf("bus: create stream %s: %w", want.Name, err)
			}
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("bus: stream %s: %w", want.Name, err)
		}
		live := st.CachedInfo().Config
		for _, d := range []struct {
			name       string
			live, want any
		}{
			// Zero asks for the server's default, which the live
			// layout holds as its value: the same setting.
			{"max_age", live.MaxAge, want.MaxAge},
			{"max_bytes", live.MaxBytes, orDefault(want.MaxBytes, -1)},
			{"duplicate_window", live.Duplicates, orDefault(want.Duplicates, defaultDuplicates(live))},
			{"max_consumers", live.MaxConsumers, orDefault(want.MaxConsumers, -1)},
			{"replicas", live.Replicas, orDefault(want.Replicas, 1)},
		} {
			if d.live != d.want {
				diffs = append(diffs, fmt.Sprintf("%s %s is %v in the live layout, %v here (floe setup changes it)", want.Name, d.name, d.live, d.want))
			}
		}
		// Compression too: a home made before it was on gets it in place
		// (nats-server compresses the blocks it seals or compacts from
		// then on and reads the plain ones as they are).
		compress := want.Compression != jetstream.NoCompression && live.Compression == jetstream.NoCompression
		if (want.AllowBatchPublish && !live.AllowBatchPublish) || (want.AllowDirect && !live.AllowDirect) || compress {
			live.AllowBatchPublish = live.AllowBatchPublish || want.AllowBatchPublish
			live.AllowDirect = live.AllowDirect || want.AllowDirect
			if compress {
				live.Compression = want.Compression
			}
			if _, err := js.UpdateStream(ctx, live); err != nil {
				return nil, nil, fmt.Errorf("bus: enable batched publishing and compression on %s: %w", want.Name, err)
			}
		}
	}
	sessions, err := setupBucket(ctx, js, c)
	return sessions, diffs, err
}

// orDefault is v, or def when v is zero (a setting left to the server).
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// defaultDuplicates is the duplicate window the server gives a stream
// created without one: two minutes, or its max age when shorter.
func defaultDuplicates(live jetstream.StreamConfig) time.Duration {
	const d = 2 * time.Minute
	if live.MaxAge > 0 && live.MaxAge < d {
		return live.MaxAge
	}
	return d
}

func streamConfigs(c Config) []jetstream.StreamConfig {
	return []jetstream.StreamConfig{
		SessionsStreamConfig(c),
		{
			Name:      omni.TasksStream,
			Subjects:  []string{"floe.task.>"},
			Retention: jetstream.WorkQueuePolicy,
			Storage:   c.storage(),
			Replicas:  c.replicas(),
		},
		{
			Name:      omni.ToolsStream,
			Subjects:  []string{"floe.tool.>"},
			Retention: jetstream.WorkQueuePolicy,
			Storage:   c.storage(),
			Replicas:  c.replicas(),
		},
	}
}

// setupBucket creates the Session record bucket, or opens it as it is,
// and the context snapshot bucket (what it holds can always be rebuilt:
// one version per key, no replicas beyond the layout's).
func setupBucket(ctx context.Context, js jetstream.JetStream, c Config) (*Sessions, error) {
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      omni.SnapshotsBucket,
		Description: "Floe context snapshots: a Session's folded model context and the stream sequence it covers",
		History:     1,
		Compression: !c.Memory,
		Storage:     c.storage(),
		Replicas:    c.replicas(),
	}); err != nil {
		return nil, fmt.Errorf("bus: create bucket %s: %w", omni.SnapshotsBucket, err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      omni.LocksBucket,
		Description: "Floe per-path file locks of the toolrunners, each with a lease (per-key TTL)",
		History:     1,
		// Per-key TTLs on; a lease's expiry leaves a marker this long.
		LimitMarkerTTL: time.Second,
		Storage:        c.storage(),
		Replicas:       c.replicas(),
	}); err != nil {
		return nil, fmt.Errorf("bus: create bucket %s: %w", omni.LocksBucket, err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, SignInsBucketConfig(c)); err != nil {
		return nil, fmt.Errorf("bus: create bucket %s: %w", omni.SignInsBucket, err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      omni.SessionsBucket,
		Description: "Floe Session records",
		History:     1,
		Compression: !c.Memory,
		Storage:     c.storage(),
		Replicas:    c.replicas(),
	})
	if err != nil {
		return nil, fmt.Errorf("bus: create bucket %s: %w", omni.SessionsBucket, err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      omni.ProtocolsBucket,
		Description: "Floe's AG-UI and A2A bindings to Sessions and Tasks",
		History:     1,
		Storage:     c.storage(),
		Replicas:    c.replicas(),
	}); err != nil {
		return nil, fmt.Errorf("bus: create bucket %s: %w", omni.ProtocolsBucket, err)
	}
	return &Sessions{kv: kv, nc: js.Conn()}, nil
}

// SignInTTL is how long a browser sign-in lasts: the max age of the
// SignInsBucket's entries.
const SignInTTL = 7 * 24 * time.Hour

// SignInsBucketConfig is the browser sign-in bucket of the layout.
func SignInsBucketConfig(c Config) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      omni.SignInsBucket,
		Description: "Floe browser sign-ins, keyed by the SHA-256 of the cookie",
		History:     1,
		TTL:         SignInTTL,
		Storage:     c.storage(),
		Replicas:    c.replicas(),
	}
}

// Open returns the Session record store of an existing layout.
func Open(ctx context.Context, js jetstream.JetStream) (*Sessions, error) {
	kv, err := js.KeyValue(ctx, omni.SessionsBucket)
	if err != nil {
		return nil, fmt.Errorf("bus: open bucket %s: %w", omni.SessionsBucket, err)
	}
	return &Sessions{kv: kv, nc: js.Conn()}, nil
}

// Header names.
const (
	HeaderContentType = "Content-Type"
)

// ClientOptions are the connect options of every Floe service connection
// (name "floe-<service>"): reconnect forever, every 250 ms.
func ClientOptions(service string) []nats.Option {
	return []nats.Option{nats.Name("floe-" + service), nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond)}
}

// PublishJS returns the JetStream a service's publish.Publishers use, on a
// connection with nc's options (servers, credentials, inbox prefix) but no
// reconnect buffer, named "<name>-publish". A publish while it is down
// fails at once instead of being kept and sent after the reconnect: by then
// its Publisher may have declared it lost (after its AckTimeout) and the
// engine closed the attempt with what the stream held, and a buffered
// message stored after that would land after later ones. publish.New
// refuses a connection that buffers. The service's other traffic stays on
// nc, with the client's usual buffering. When nc has no buffer itself it is
// used as is; close releases what PublishJS opened.
func PublishJS(nc *nats.Conn) (js jetstream.JetStream, close func(), err error) {
	pub, close := nc, func() {}
	if nc.Opts.ReconnectBufSize >= 0 {
		o := nc.Opts
		o.ReconnectBufSize = -1
		o.Name += "-publish"
		if pub, err = o.Connect(); err != nil {
			return nil, nil, fmt.Errorf("bus: publishing connection: %w", err)
		}
		close = pub.Close
	}
	if js, err = jetstream.New(pub); err != nil {
		close()
		return nil, nil, fmt.Errorf("bus: publishing connection: %w", err)
	}
	return js, close, nil
}

// PackMsg builds a NATS message carrying a msgpack internal payload.
func PackMsg(subject string, v any) (*nats.Msg, error) {
	b, err := omni.Pack(v)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(subject)
	m.Data = b
	m.Header.Set(HeaderContentType, omni.ContentTypeMsgpack)
	return m, nil
}

// SessionMsg builds the NATS message that publishes m on its Session subject.
// msgID, when set, becomes Nats-Msg-Id so the stream drops a duplicate.
func SessionMsg(sessionID string, m *omni.Message, msgID string) (*nats.Msg, error) {
	return SessionMsgClass(sessionID, omni.ClassOf(m), m, msgID)
}

// SessionMsgClass is SessionMsg on an explicit subject class (e.g. trace).
func SessionMsgClass(sessionID, class string, m *omni.Message, msgID string) (*nats.Msg, error) {
	b, err := omni.Marshal(m)
	if err != nil {
		return nil, err
	}
	nm := nats.NewMsg(omni.SessionSubject(sessionID, class))
	nm.Data = b
	if msgID != "" {
		nm.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	return nm, nil
}

// OutputMsgID is the Nats-Msg-Id of a tool call's complete output: whoever
// publishes it (the runner, or the engine declaring the runner lost), the
// stream keeps only the first.
func OutputMsgID(sessionID, toolCallID string) string {
	return sessionID + "/" + toolCallID + "/out"
}

// ErrNoResponders is returned when nobody serves a request subject.
var ErrNoResponders = nats.ErrNoResponders

// IsNoResponders reports whether err means nobody served a request.
func IsNoResponders(err error) bool {
	return errors.Is(err, nats.ErrNoResponders)
}
