package sandbox

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkTrue runs `bash -c true` (no login profile: the command's own
// start, not the host's dotfiles) unconfined and under each backend the host
// has, network on and off; compare the ns/op of one run.
func BenchmarkTrue(b *testing.B) {
	ws := b.TempDir()
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"off", Config{Backend: Off}},
		{"landlock", Config{Backend: Landlock}},
		{"landlock-netoff", Config{Backend: Landlock, NetworkOff: true}},
		{"bwrap", Config{Backend: Bwrap}},
		{"bwrap-netoff", Config{Backend: Bwrap, NetworkOff: true}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, err := New(c.cfg)
			if err != nil {
				b.Skip(err)
			}
			defer s.Close()
			for b.Loop() {
				p, err := s.Command(b.Context(), Spec{Argv: []string{"bash", "-c", "true"}, Workspace: ws, Env: []string{"PATH=/usr/bin:/bin", "HOME=" + ws}})
				if err != nil {
					b.Fatal(err)
				}
				err = p.Run()
				if ex := p.Exit(err); ex.Code != 0 || ex.Error != "" {
					b.Fatalf("exit %+v", ex)
				}
				p.Close()
			}
		})
	}
}

// offAndLandlock opens the unconfined and the landlock Sandbox a benchmark
// compares (the confined one closed at its end); it is skipped where
// landlock is not available.
func offAndLandlock(b *testing.B) (off, conf *Sandbox) {
	b.Helper()
	off, err := New(Config{Backend: Off})
	if err != nil {
		b.Fatal(err)
	}
	conf, err = New(Config{Backend: Landlock})
	if err != nil {
		b.Skip(err)
	}
	b.Cleanup(conf.Close)
	return off, conf
}

// BenchmarkConcurrentTrue is the throughput of one Sandbox under
// concurrent calls (a toolrunner runs 8 at once): every iteration a round
// of 32 `bash -c true` through 8 workers unconfined, then the same
// confined (landlock), so that both see the same machine load. It
// reports each one's calls per second and their ratio.
func BenchmarkConcurrentTrue(b *testing.B) {
	const workers, round = 8, 32
	ws := b.TempDir()
	off, conf := offAndLandlock(b)
	runRound := func(s *Sandbox) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		jobs := make(chan int, round)
		for i := range round {
			jobs <- i
		}
		close(jobs)
		for range workers {
			wg.Go(func() {
				for range jobs {
					p, err := s.Command(context.Background(), Spec{Argv: []string{"bash", "-c", "true"}, Workspace: ws, Env: []string{"PATH=/usr/bin:/bin", "HOME=" + ws}})
					if err != nil {
						b.Error(err)
						return
					}
					err = p.Run()
					if ex := p.Exit(err); ex.Code != 0 || ex.Error != "" {
						b.Errorf("exit %+v", ex)
					}
					p.Close()
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	runRound(off)
	runRound(conf)
	var tOff, tConf time.Duration
	for b.Loop() {
		tOff += runRound(off)
		tConf += runRound(conf)
	}
	calls := float64(b.N * round)
	b.ReportMetric(calls/tOff.Seconds(), "off-calls/s")
	b.ReportMetric(calls/tConf.Seconds(), "confined-calls/s")
	b.ReportMetric(tOff.Seconds()/tConf.Seconds(), "confined/off-throughput")
}

// BenchmarkCallCPU is what confinement costs the runner's machine per
// call, in CPU: every iteration ten unconfined and then ten confined (the
// direct start as root) calls of a command — `true`, and `bash -lc true`
// (what exec_command runs, a few milliseconds) — the CPU time (user and system, of this
// process and the children it waited for: the runner's threads, the
// namespaces' inits, the command) measured around each ten, so that what
// a confined call does after its outcome is out (its tree's recycling)
// is counted with the confined calls but for the last of each ten (one
// call a pair at a time let it fall in the next unconfined call). It
// reports each one's CPU per call, the difference (the confinement's own
// work; what the kernel defers to its own threads is not in it), and the
// same for this process alone (the runner's own CPU, RUSAGE_SELF).
func BenchmarkCallCPU(b *testing.B) {
	for _, c := range []struct {
		name string
		argv []string
	}{
		{"true", []string{"true"}},
		{"bash-lc-true", []string{"bash", "-lc", "true"}},
	} {
		b.Run(c.name, func(b *testing.B) { benchCallCPU(b, c.argv) })
	}
}

func benchCallCPU(b *testing.B, argv []string) {
	const chunk = 10
	ws := b.TempDir()
	off, conf := offAndLandlock(b)
	call := func(s *Sandbox) {
		p, err := s.Command(b.Context(), Spec{Argv: argv, Workspace: ws, Env: []string{"PATH=/usr/bin:/bin", "HOME=" + ws}})
		if err != nil {
			b.Fatal(err)
		}
		err = p.Run()
		if ex := p.Exit(err); ex.Code != 0 || ex.Error != "" {
			b.Fatalf("exit %+v", ex)
		}
		p.Close()
	}
	calls := func(s *Sandbox) (all, self time.Duration) {
		c0, s0 := cpuTime(), selfTime()
		for range chunk {
			call(s)
		}
		return cpuTime() - c0, selfTime() - s0
	}
	for range 4 {
		call(off)
		call(conf)
	}
	var cOff, cConf, sOff, sConf time.Duration
	for b.Loop() {
		c, s := calls(off)
		cOff, sOff = cOff+c, sOff+s
		c, s = calls(conf)
		cConf, sConf = cConf+c, sConf+s
	}
	n := float64(b.N * chunk)
	b.ReportMetric(cOff.Seconds()*1e6/n, "off-cpu-us/call")
	b.ReportMetric(cConf.Seconds()*1e6/n, "confined-cpu-us/call")
	b.ReportMetric((cConf-cOff).Seconds()*1e6/n, "excess-cpu-us/call")
	b.ReportMetric((sConf-sOff).Seconds()*1e6/n, "excess-self-cpu-us/call")
}

// cpuTime is the CPU time (user and system) of this process and of its
// children waited for.
func cpuTime() time.Duration {
	var self, children syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	var t time.Duration
	for _, tv := range []syscall.Timeval{self.Utime, self.Stime, children.Utime, children.Stime} {
		t += time.Duration(tv.Nano())
	}
	return t
}

// selfTime is the CPU time (user and system) of this process alone.
func selfTime() time.Duration {
	var self syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	return time.Duration(self.Utime.Nano() + self.Stime.Nano())
}
