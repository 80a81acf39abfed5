package sandbox

import (
	"testing"
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
