package tools

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"floe.dev/pkg/procfs"
	"floe.dev/pkg/sandbox"
)

func TestExecCommand(t *testing.T) {
	ws := t.TempDir()
	real := realDir(t, ws)
	if err := os.Mkdir(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(ws, "file.txt"), "x")
	tests := []struct {
		name    string
		opts    Options
		cmd     string
		workdir string
		env     []string
		want    string
		failed  bool
	}{
		{name: "stdout", cmd: "echo hello", want: "hello\n"},
		{name: "stderr merged in order", cmd: "echo out; echo err >&2; echo out2", want: "out\nerr\nout2\n"},
		{name: "exit code note", cmd: "echo oops; exit 2", want: "oops\n[exit code: 2]", failed: true},
		{name: "exit code note without newline", cmd: "printf partial; exit 1", want: "partial\n[exit code: 1]", failed: true},
		{name: "exit code note alone", cmd: "exit 3", want: "[exit code: 3]", failed: true},
		{name: "killed by a signal", cmd: "kill -TERM $$", want: "[killed by signal: terminated]", failed: true},
		{name: "no output", cmd: "true", want: NoOutput},
		{name: "stdin is empty", cmd: "cat", want: NoOutput},
		{name: "FLOE env visible", cmd: `echo "$FLOE_SESSION_ID $FLOE_TOOL_CALL_ID"`,
			env: []string{"FLOE_SESSION_ID=s-1", "FLOE_TOOL_CALL_ID=tc-1"}, want: "s-1 tc-1\n"},
		{name: "call env wins over the process env", cmd: `echo "$PATH_CHECK"`,
			env: []string{"PATH_CHECK=first", "PATH_CHECK=second"}, want: "second\n"},
		{name: "runs in the workspace", cmd: "pwd -P", want: real + "\n"},
		{name: "workdir relative", cmd: "pwd -P", workdir: "sub", want: real + "/sub\n"},
		{name: "workdir absolute", cmd: "pwd -P", workdir: filepath.Join(ws, "sub"), want: real + "/sub\n"},
		{name: "workdir outside", cmd: "pwd", workdir: "../", want: `path "../" is outside the workspace`, failed: true},
		{name: "workdir outside absolute", cmd: "pwd", workdir: "/etc", want: `path "/etc" is outside the workspace`, failed: true},
		{name: "workdir missing", cmd: "pwd", workdir: "nope", want: "workdir " + ws + "/nope does not exist", failed: true},
		{name: "workdir a file", cmd: "pwd", workdir: "file.txt", want: "workdir " + ws + "/file.txt is not a directory", failed: true},
		{name: "multibyte output truncated on a rune boundary", opts: Options{MaxOutput: 3}, cmd: "printf 'ééééé'",
			want: "ééé\n[output truncated: 2 more characters]"},
		{name: "exit note kept after truncation", opts: Options{MaxOutput: 20}, cmd: "seq 1 100; exit 7",
			want: "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n[output truncated: 272 more characters]\n[exit code: 7]", failed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := map[string]any{"description": "test", "cmd": tt.cmd}
			if tt.workdir != "" {
				a["workdir"] = tt.workdir
			}
			r := Builtin(tt.opts)
			res := execute(t, t.Context(), r, Call{Name: "exec_command", Arguments: args(t, a), Workspace: ws, Env: tt.env})
			if res.Output != tt.want || res.Failed != tt.failed {
				t.Errorf("exec_command(%q) = %+v, want {Output:%q Failed:%v}", tt.cmd, res, tt.want, tt.failed)
			}
		})
	}
}

func TestExecCommandStreamsOutputBeforeExit(t *testing.T) {
	// The command waits on a FIFO that the test opens only after it has
	// seen the first line, so the call can end only if output is streamed.
	ws := t.TempDir()
	fifo := filepath.Join(ws, "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	openErr := make(chan error, 1)
	onFragment := func(s string) {
		if strings.Contains(s, "ready") {
			once.Do(func() {
				f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
				if err == nil {
					err = f.Close()
				}
				openErr <- err
			})
		}
	}
	r := Builtin(Options{})
	res := executeWith(t, t.Context(), r, Call{
		Name:      "exec_command",
		Arguments: args(t, map[string]any{"description": "test", "cmd": "echo ready; cat go; echo done", "timeout_ms": 20000}),
		Workspace: ws,
	}, onFragment)
	if res.Failed || res.Output != "ready\ndone\n" {
		t.Fatalf("exec_command = %+v, want ready and done", res)
	}
	if err := <-openErr; err != nil {
		t.Fatal(err)
	}
}

func TestExecCommandTimeoutKillsProcessGroup(t *testing.T) {
	r := Builtin(Options{})
	mark := uniqueSleep()
	start := time.Now()
	res := execute(t, t.Context(), r, Call{
		Name:      "exec_command",
		Arguments: args(t, map[string]any{"description": "test", "cmd": "sleep " + mark + " & setsid nohup sleep " + mark + " >/dev/null 2>&1 & wait", "timeout_ms": 300}),
		Workspace: t.TempDir(),
	})
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("exec_command took %v with timeout_ms 300", elapsed)
	}
	if !res.Failed || !strings.HasSuffix(res.Output, "[timed out after 300ms]") {
		t.Fatalf("exec_command = %+v, want failed with the timeout note", res)
	}
	checkProcessesGone(t, mark)
}

func TestExecCommandCancelKillsProcessGroup(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r := Builtin(Options{})
	mark := uniqueSleep()
	seen := ""
	res := executeWith(t, ctx, r, Call{
		Name:      "exec_command",
		Arguments: args(t, map[string]any{"description": "test", "cmd": "sleep " + mark + " & setsid nohup sleep " + mark + " >/dev/null 2>&1 & echo started; wait"}),
		Workspace: t.TempDir(),
	}, func(s string) {
		seen += s
		if strings.Contains(seen, "started") {
			cancel()
		}
	})
	if !res.Failed || !strings.HasSuffix(res.Output, "started\n[canceled]") {
		t.Fatalf("exec_command = %+v, want failed with the cancel note", res)
	}
	checkProcessesGone(t, mark)
}

// uniqueSleep returns a sleep duration no other test uses, so the
// processes of one call can be found by their command line (a confined
// call's pids are its PID namespace's, not ours).
func uniqueSleep() string {
	return fmt.Sprintf("1000.%d%d", os.Getpid(), sleepSeq.Add(1))
}

var sleepSeq atomic.Int64

// checkProcessesGone checks that every `sleep mark`, the call's own and
// the one it daemonized, is gone within 2 s of the call's end.
func checkProcessesGone(t *testing.T, mark string) {
	t.Helper()
	checkFor(t, 2*time.Second, func() error {
		if pids := procfs.WithArgs(mark); len(pids) > 0 {
			return fmt.Errorf("processes %v (sleep %s) still running", pids, mark)
		}
		return nil
	})
}

func TestExecCommandTimeoutIsCappedAtMaxTimeout(t *testing.T) {
	r := Builtin(Options{MaxTimeout: 200 * time.Millisecond})
	res := execute(t, t.Context(), r, Call{
		Name:      "exec_command",
		Arguments: args(t, map[string]any{"description": "test", "cmd": "sleep 1000", "timeout_ms": 600000}),
		Workspace: t.TempDir(),
	})
	if want := "[timed out after 200ms]"; !res.Failed || res.Output != want {
		t.Errorf("exec_command = %+v, want failed with %q", res, want)
	}
}

func TestExecCommandDefaultTimeout(t *testing.T) {
	r := Builtin(Options{DefaultTimeout: 2 * time.Second})
	res := execute(t, t.Context(), r, Call{
		Name:      "exec_command",
		Arguments: args(t, map[string]any{"description": "test", "cmd": "echo begun; sleep 1000"}),
		Workspace: t.TempDir(),
	})
	if want := "begun\n[timed out after 2s]"; !res.Failed || res.Output != want {
		t.Errorf("exec_command = %+v, want failed with %q", res, want)
	}
}

func TestExecCommandDoesNotWaitForBackgroundProcesses(t *testing.T) {
	// The background sleep keeps the output pipe open after bash exits.
	r := Builtin(Options{})
	start := time.Now()
	res := execute(t, t.Context(), r, Call{
		Name:      "exec_command",
		Arguments: args(t, map[string]any{"description": "test", "cmd": "sleep 1000 & echo $$"}),
		Workspace: t.TempDir(),
	})
	// Unconfined, the sleep outlives the call: kill its group. Confined,
	// it died with the call, and $$ is a pid of the call's namespace that
	// must never be signalled on the host (as 1 it would be kill(-1)).
	if pgid, err := strconv.Atoi(strings.TrimSpace(res.Output)); err == nil && pgid > 1 && defaultSandbox().Backend() == sandbox.Off {
		t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	}
	if res.Failed {
		t.Errorf("exec_command = %+v, want success", res)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("exec_command took %v", elapsed)
	}
}

func TestExecCommandTruncatesHugeOutputInBoundedMemory(t *testing.T) {
	const total = 100 << 20 // 104857600 characters
	r := Builtin(Options{})
	var res Result
	peak := peakHeapGrowth(func() {
		res = execute(t, t.Context(), r, Call{
			Name: "exec_command",
			Arguments: args(t, map[string]any{
				"description": "test",
				"cmd":         "head -c 104857600 /dev/zero | tr '\\0' a",
				"timeout_ms":  120000,
			}),
			Workspace: t.TempDir(),
		})
	})
	want := strings.Repeat("a", DefaultMaxOutput) + "\n" + TruncationMarker(total-DefaultMaxOutput)
	if res.Failed || res.Output != want {
		t.Errorf("exec_command = {Output:%q Failed:%v}, want %q", clip(res.Output), res.Failed, clip(want))
	}
	if want := "[output truncated: 104841600 more characters]"; !strings.HasSuffix(res.Output, want) {
		t.Errorf("output ends %q, want %q", clip(res.Output), want)
	}
	t.Logf("heap grew by %d KiB at most", peak>>10)
	if peak > 32<<20 {
		t.Errorf("heap grew by %d MiB while printing 100 MiB, want it bounded", peak>>20)
	}
}

// peakHeapGrowth runs f and returns how far the live heap rose above its
// level before f, sampled every millisecond.
func peakHeapGrowth(f func()) uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	runtime.GC()
	metrics.Read(sample)
	base := sample[0].Value.Uint64()
	peak := base
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		s := []metrics.Sample{{Name: sample[0].Name}}
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	f()
	close(stop)
	<-done
	return peak - base
}
