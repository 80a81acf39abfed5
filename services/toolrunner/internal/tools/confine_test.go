package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// swapperEnv makes the test binary the swapping process of
// TestConfinementHoldsWhileAPathComponentIsSwapped.
const swapperEnv = "FLOE_TEST_SWAP_DIR"

// swapForever makes dir/a alternate, as fast as the kernel goes, between a
// real directory and a symbolic link to outside (an atomic exchange with
// dir/a.link, so dir/a always exists), until it is killed.
func swapForever(dir string) {
	a, link := filepath.Join(dir, "a"), filepath.Join(dir, "a.link")
	for {
		if err := exchange(a, link); err != nil {
			// No renameat2: plain renames, with moments where a is missing.
			real := filepath.Join(dir, "a.dir")
			os.Rename(a, real)
			os.Rename(link, a)
			os.Rename(a, link)
			os.Rename(real, a)
		}
	}
}

// exchange swaps two paths atomically with renameat2(RENAME_EXCHANGE).
func exchange(a, b string) error {
	nr := map[string]uintptr{"amd64": 316, "arm64": 276}[runtime.GOARCH]
	if nr == 0 {
		return syscall.ENOSYS
	}
	pa, err := syscall.BytePtrFromString(a)
	if err != nil {
		return err
	}
	pb, err := syscall.BytePtrFromString(b)
	if err != nil {
		return err
	}
	const atFDCWD, renameExchange = ^uintptr(99), 2 // AT_FDCWD is -100
	_, _, e := syscall.Syscall6(nr, atFDCWD, uintptr(unsafe.Pointer(pa)), atFDCWD, uintptr(unsafe.Pointer(pb)), renameExchange, 0)
	if e != 0 {
		return e
	}
	return nil
}

func TestConfinementHoldsWhileAPathComponentIsSwapped(t *testing.T) {
	base := t.TempDir()
	ws, outside := filepath.Join(base, "ws"), filepath.Join(base, "outside")
	writeTestFile(t, filepath.Join(ws, "a", "f"), "inside\n")
	writeTestFile(t, filepath.Join(outside, "f"), "SECRET\n")
	writeTestFile(t, filepath.Join(outside, "e"), "SECRET\n")
	symlink(t, outside, filepath.Join(ws, "a.link"))
	writeTestFile(t, filepath.Join(ws, "a", "e"), "inside\n")

	swapper := exec.Command(os.Args[0], "-test.run=^$")
	swapper.Env = append(os.Environ(), swapperEnv+"="+ws)
	if err := swapper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { swapper.Process.Kill(); swapper.Wait() })

	r := Builtin(Options{})
	const calls = 400
	var escapes, inside, refused atomic.Int64
	var mu sync.Mutex
	var firstEscape string
	escape := func(what string) {
		escapes.Add(1)
		mu.Lock()
		if firstEscape == "" {
			firstEscape = what
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var call Call
			switch i % 4 {
			case 0, 1:
				call = Call{Name: "read_file", Arguments: args(t, map[string]any{"file_path": "a/f"})}
			case 2:
				call = Call{Name: "write_file", Arguments: args(t, map[string]any{"file_path": fmt.Sprintf("a/w%d", i), "content": "x"})}
			case 3:
				call = Call{Name: "edit_file", Arguments: args(t, map[string]any{"file_path": "a/e", "old_string": "inside", "new_string": "inside" + fmt.Sprint(i)})}
			}
			call.Workspace = ws
			res := r.Execute(ctx, call, nil)
			switch {
			case strings.Contains(res.Output, "SECRET"):
				escape(call.Name + ": " + res.Output)
			case !res.Failed:
				inside.Add(1)
			default:
				refused.Add(1)
			}
		})
	}
	// exec_command's workdir too (fewer: each starts a shell).
	for range 24 {
		wg.Go(func() {
			res := r.Execute(context.Background(), Call{Name: "exec_command", Workspace: ws,
				// The kernel's idea of the directory (bash's own pwd would
				// re-resolve a name the swapper may have just turned into
				// a link), a read and a write relative to it.
				Arguments: args(t, map[string]any{"description": "where", "cmd": "readlink /proc/$$/cwd; cat f; echo x > exec-wrote", "workdir": "a"})}, nil)
			if strings.Contains(res.Output, "SECRET") || strings.Contains(res.Output, outside) {
				escape("exec_command: " + res.Output)
			}
		})
	}
	wg.Wait()
	swapper.Process.Kill()
	swapper.Wait()

	// Nothing written or edited outside.
	entries, _ := os.ReadDir(outside)
	for _, e := range entries {
		if e.Name() != "f" && e.Name() != "e" {
			escape("a file written outside: " + e.Name())
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "e")); string(b) != "SECRET\n" {
		escape("the file outside was edited: " + string(b))
	}
	t.Logf("%d calls: %d succeeded inside, %d refused or missed the directory, %d escapes", calls, inside.Load(), refused.Load(), escapes.Load())
	if n := escapes.Load(); n > 0 {
		t.Errorf("%d escapes; first: %s", n, firstEscape)
	}
	if inside.Load() == 0 || refused.Load() == 0 {
		t.Errorf("the swap was not exercised: %d inside, %d refused", inside.Load(), refused.Load())
	}
}

func TestFileToolsRefuseSpecialAndHugeFilesInBoundedTime(t *testing.T) {
	ws := t.TempDir()
	fifo := filepath.Join(ws, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sparse := filepath.Join(ws, "sparse")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	long := filepath.Join(ws, "long.txt") // text, just over the cap
	writeTestFile(t, long, strings.Repeat("abcdefghi\n", MaxFileSize/10+1))
	r := Builtin(Options{DefaultTimeout: 20 * time.Second})
	tests := []struct {
		name string
		call map[string]any
		want string
	}{
		{"read_file", map[string]any{"file_path": "fifo"}, "is a FIFO"},
		{"write_file", map[string]any{"file_path": "fifo", "content": "x"}, "is a FIFO"},
		{"edit_file", map[string]any{"file_path": "fifo", "old_string": "a", "new_string": "b"}, "is a FIFO"},
		{"read_file", map[string]any{"file_path": "sparse"}, "binary"},
		{"edit_file", map[string]any{"file_path": "sparse", "old_string": "a", "new_string": "b"}, "over the 10485760-byte limit"},
		{"edit_file", map[string]any{"file_path": "long.txt", "old_string": "abc", "new_string": "x"}, "over the 10485760-byte limit"},
		{"write_file", map[string]any{"file_path": "big.txt", "content": strings.Repeat("x", MaxFileSize+1)}, "over the 10485760-byte limit"},
		{"read_file", map[string]any{"file_path": "/dev/zero"}, "outside the workspace"},
	}
	for _, tt := range tests {
		done := make(chan Result, 1)
		go func() {
			done <- r.Execute(context.Background(), Call{Name: tt.name, Arguments: args(t, tt.call), Workspace: ws}, nil)
		}()
		select {
		case res := <-done:
			if !res.Failed || !strings.Contains(res.Output, tt.want) {
				t.Errorf("%s %v = %+v, want failed mentioning %q", tt.name, tt.call["file_path"], clip(res.Output), tt.want)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%s %v is still blocked", tt.name, tt.call["file_path"])
		}
	}
	if fi, err := os.Stat(sparse); err != nil || fi.Size() != 2<<30 {
		t.Errorf("sparse file changed: %v %v", fi.Size(), err)
	}
	if _, err := os.Stat(filepath.Join(ws, "big.txt")); !os.IsNotExist(err) {
		t.Errorf("over-cap write_file created the file: %v", err)
	}
}

// blockingTool ignores its context, as a tool stuck in a system call would.
type blockingTool struct{ release chan struct{} }

func (blockingTool) Spec() Spec {
	return Spec{Name: "stuck", Parameters: []byte(`{"type":"object","properties":{},"additionalProperties":false}`), Permission: PermRead}
}

func (b blockingTool) Run(ctx context.Context, call Call, args json.RawMessage, emit Emit) Result {
	<-b.release
	emit("late")
	return Result{Output: "late"}
}

func TestExecuteReturnsAfterTheTimeoutWhateverTheToolIsBlockedOn(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	r := NewRegistry(Options{DefaultTimeout: 100 * time.Millisecond}, blockingTool{release})
	done := make(chan Result, 1)
	go func() { done <- r.Execute(context.Background(), Call{Name: "stuck", Workspace: t.TempDir()}, nil) }()
	select {
	case res := <-done:
		if !res.Failed || !strings.Contains(res.Output, "timed out") || strings.Contains(res.Output, "late") {
			t.Errorf("stuck tool = %+v, want a failed timeout without its late output", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Execute waited for a tool that ignores its context")
	}
}
