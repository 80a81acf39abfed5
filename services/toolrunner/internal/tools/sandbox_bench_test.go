package tools

import (
	"context"
	"testing"
	"time"

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
	b.Run("auto-vs-off", func(b *testing.B) { benchAutoVsOff(b, ws) })
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

// benchAutoVsOff alternates one unconfined and one confined (the backend
// auto picks) exec_command per iteration, so that both see the same
// machine load, and reports each one's time and their ratio (the target
// of issue 20: confined ÷ unconfined ≤ 1.5).
func benchAutoVsOff(b *testing.B, ws string) {
	off, err := sandbox.New(sandbox.Config{Backend: sandbox.Off})
	if err != nil {
		b.Fatal(err)
	}
	auto, err := sandbox.New(sandbox.Config{Backend: sandbox.Auto})
	if err != nil {
		b.Fatal(err)
	}
	defer auto.Close()
	if auto.Backend() == sandbox.Off {
		b.Skip("no sandbox backend on this host")
	}
	b.Logf("auto is %s", auto.Backend())
	roff, rauto := Builtin(Options{Sandbox: off}), Builtin(Options{Sandbox: auto})
	call := Call{Name: "exec_command", Arguments: `{"description":"bench","cmd":"true"}`, Workspace: ws}
	var tOff, tAuto time.Duration
	for b.Loop() {
		for _, c := range []struct {
			r *Registry
			t *time.Duration
		}{{roff, &tOff}, {rauto, &tAuto}} {
			start := time.Now()
			if res := c.r.Execute(context.Background(), call, nil); res.Failed {
				b.Fatalf("exec_command true: %+v", res)
			}
			*c.t += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(tOff.Nanoseconds())/n, "off-ns/op")
	b.ReportMetric(float64(tAuto.Nanoseconds())/n, "confined-ns/op")
	b.ReportMetric(float64(tAuto)/float64(tOff), "confined/off")
}
