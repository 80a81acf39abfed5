package tracer_test

import (
	"flag"
	"testing"

	"floe.dev/services/tracer"
)

func TestFromEnvAndFlags(t *testing.T) {
	c, err := tracer.FromEnv(func(k string) string {
		return map[string]string{"FLOE_HOME": "/env/home"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := tracer.DefaultConfig(); c.Home != "/env/home" || c.Durable != d.Durable || c.Batch != d.Batch {
		t.Fatalf("FromEnv = %+v, want DefaultConfig with Home /env/home", c)
	}
	fs := flag.NewFlagSet("tracer", flag.ContinueOnError)
	c.Flags(fs)
	if err := fs.Parse(nil); err != nil || c.Home != "/env/home" {
		t.Fatalf("no flag: Home %q (%v), want /env/home", c.Home, err)
	}
	if err := fs.Parse([]string{"--home", "/flag/home"}); err != nil || c.Home != "/flag/home" {
		t.Fatalf("--home /flag/home: Home %q (%v), want the flag's", c.Home, err)
	}
}
