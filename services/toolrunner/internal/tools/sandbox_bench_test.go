package tools

import (
	"context"
	"testing"

	"floe.dev/pkg/sandbox"
)

// BenchmarkExecCommandTrue is the cost of the sandbox on a trivial
// exec_command (`true`, bash -lc with HOME an empty directory so no
// dotfile weighs in): unconfined, then under each backend the host has.
// Compare the ns/op of one run (protocol.md §7; issue 20's target: confined ÷
// unconfined ≤ 1.5).
func BenchmarkExecCommandTrue(b *testing.B) {
	home := b.TempDir()
	b.Setenv("HOME", home)
	ws := b.TempDir()
	for _, backend := range []sandbox.Backend{sandbox.Off, sandbox.Landlock, sandbox.Bwrap} {
		b.Run(string(backend), func(b *testing.B) {
			sb, err := sandbox.New(sandbox.Config{Backend: backend})
			if err != nil {
				b.Skip(err)
			}
			defer sb.Close()
			r := Builtin(Options{Sandbox: sb})
			call := Call{Name: "exec_command", Arguments: `{"description":"bench","cmd":"true"}`, Workspace: ws}
			for b.Loop() {
				if res := r.Execute(context.Background(), call, nil); res.Failed {
					b.Fatalf("exec_command true: %+v", res)
				}
			}
		})
	}
}
