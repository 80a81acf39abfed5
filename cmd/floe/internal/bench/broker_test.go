package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestMain lets this test binary serve as the broker child of
// startBroker, as floebench does.
func TestMain(m *testing.M) {
	if store := os.Getenv(BrokerEnv); store != "" {
		os.Exit(RunBroker(store))
	}
	if format := os.Getenv(ModelEnv); format != "" {
		os.Exit(RunModel(format))
	}
	os.Exit(m.Run())
}

// TestBrokerChild: the broker child serves JetStream on its URL, answers
// snapshots with its own memory (its heap grows with what it stores, this
// process's figures are not its), and exits when told to stop.
func TestBrokerChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	br, err := startBroker(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer br.stop()
	before, err := br.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if before.RSS <= 0 || before.Heap <= 0 {
		t.Fatalf("broker snapshot %+v: want its RSS and heap", before)
	}
	nc, err := nats.Connect(br.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 16<<10)
	for i := range 1000 { // 16 MiB held in the child's memory store
		if _, err := js.Publish(ctx, "t.x", body); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	after, err := br.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if grew := after.Heap - before.Heap; grew < 12<<20 {
		t.Errorf("broker heap grew %d bytes after storing 16 MiB in memory: the snapshot is not the child's", grew)
	}
	nc.Close()
	done := make(chan struct{})
	go func() { br.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("broker child did not stop")
	}
	if br.cmd.ProcessState == nil || !br.cmd.ProcessState.Exited() {
		t.Errorf("broker child state %v: want exited", br.cmd.ProcessState)
	}
}
