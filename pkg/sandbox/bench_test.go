package sandbox

import (
	"context"
	"sync"
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

// BenchmarkConcurrentTrue is the throughput of one Sandbox under
// concurrent calls (a toolrunner runs 8 at once): every iteration a round
// of 32 `bash -c true` through 8 workers unconfined, then the same
// confined (landlock), so that both see the same machine load. It
// reports each one's calls per second and their ratio.
func BenchmarkConcurrentTrue(b *testing.B) {
	const workers, round = 8, 32
	ws := b.TempDir()
	off, err := New(Config{Backend: Off})
	if err != nil {
		b.Fatal(err)
	}
	conf, err := New(Config{Backend: Landlock})
	if err != nil {
		b.Skip(err)
	}
	defer conf.Close()
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
