package engine

import (
	"testing"
	"time"
)

func TestPartialsKeepFromEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env     string
		want    time.Duration
		wantErr bool
	}{
		{"", time.Hour, false},
		{"10m", 10 * time.Minute, false},
		{"0s", 0, false},
		{"off", -1, false},
		{"soon", 0, true},
	} {
		t.Setenv("FLOE_PARTIALS_KEEP", tc.env)
		var c Config
		err := EnvConfig(&c)
		if (err != nil) != tc.wantErr {
			t.Fatalf("FLOE_PARTIALS_KEEP=%q: EnvConfig error %v, want error %v", tc.env, err, tc.wantErr)
		}
		if err != nil {
			continue
		}
		c.Defaults()
		if c.PartialsKeep != tc.want {
			t.Errorf("FLOE_PARTIALS_KEEP=%q: PartialsKeep = %v, want %v", tc.env, c.PartialsKeep, tc.want)
		}
	}
}
