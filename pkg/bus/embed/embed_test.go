package embed

import (
	"errors"
	"testing"
)

func TestSecondServerOnSameStoreIsRefused(t *testing.T) {
	dir := t.TempDir()
	a, err := Start(Options{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(Options{StoreDir: dir}); !errors.Is(err, ErrStoreInUse) {
		t.Fatalf("second Start = %v, want ErrStoreInUse", err)
	}
	a.Shutdown()
	b, err := Start(Options{StoreDir: dir})
	if err != nil {
		t.Fatalf("Start after Shutdown = %v", err)
	}
	b.Shutdown()
}
