package svc

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
)

// testConfig follows the services' convention: FromEnv over defaults,
// flags over FromEnv, Validate last.
type testConfig struct {
	Value    string
	Prepared bool
}

func testFromEnv(getenv func(string) string) (testConfig, error) {
	c := testConfig{Value: "default"}
	if v := getenv("FLOE_SVC_TEST_VALUE"); v != "" {
		if v == "unparsable" {
			return c, errors.New("FLOE_SVC_TEST_VALUE: unparsable")
		}
		c.Value = v
	}
	return c, nil
}

func (c *testConfig) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Value, "value", c.Value, "a setting (FLOE_SVC_TEST_VALUE)")
}

func (c *testConfig) Validate() error {
	if !c.Prepared {
		return errors.New("validated before Prepare")
	}
	if c.Value == "bad" {
		return errors.New("--value bad is not usable")
	}
	return nil
}

// testService records the Config its Run got; run, if set, is Run's body.
func testService(got *testConfig, run func(ctx context.Context, nc *nats.Conn) error) Service[testConfig] {
	return Service[testConfig]{
		Name:     "svctest",
		FromEnv:  testFromEnv,
		Flags:    (*testConfig).Flags,
		Prepare:  func(c *testConfig, _ *Main) { c.Prepared = true },
		Validate: (*testConfig).Validate,
		Run: func(ctx context.Context, nc *nats.Conn, cfg testConfig, _ zerolog.Logger) error {
			*got = cfg
			if run == nil {
				return errors.New("Run was called")
			}
			return run(ctx, nc)
		},
	}
}

func TestServiceStopsBeforeConnecting(t *testing.T) {
	tests := []struct {
		name, env string
		args      []string
		code      int
		stderr    string // a substring; "" wants nothing written by exitCode
	}{
		{"help", "", []string{"-h"}, 0, ""},
		{"unknown flag", "", []string{"--nope"}, 1, "svctest: flag provided but not defined: -nope"},
		{"variable that does not parse", "unparsable", nil, 1, "svctest: FLOE_SVC_TEST_VALUE: unparsable"},
		{"unusable setting", "", []string{"--value", "bad"}, 1, "svctest: --value bad is not usable"},
		{"unusable setting from the variable", "bad", nil, 1, "svctest: --value bad is not usable"},
		{"no NATS", "", []string{"--value", "ok"}, 1, "svctest: --nats (or FLOE_NATS_URL) is required"},
		{"bad log level", "", []string{"--nats", "nats://127.0.0.1:1", "--log-level", "loud"}, 1, `svctest: --log-level "loud"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("FLOE_NATS_URL", "")
			t.Setenv("FLOE_SVC_TEST_VALUE", tt.env)
			var got testConfig
			var stderr bytes.Buffer
			if code := testService(&got, nil).exitCode(tt.args, &stderr); code != tt.code {
				t.Errorf("exit code = %d, want %d (stderr %q)", code, tt.code, stderr.String())
			}
			if tt.stderr == "" && stderr.Len() > 0 || !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr = %q, want %q", stderr.String(), tt.stderr)
			}
			if got.Prepared {
				t.Error("Run was called")
			}
		})
	}
}

// TestServiceRunsUntilASignal runs the whole main against a real broker:
// the flag beats the variable, Run gets a connection named for the
// service with its own inbox prefix, and SIGTERM ends it with status 0.
func TestServiceRunsUntilASignal(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	t.Setenv("FLOE_NATS_URL", env.Server.ClientURL())
	t.Setenv("FLOE_SVC_TEST_VALUE", "from-env")
	t.Setenv("FLOE_METRICS_ADDR", "")
	var got testConfig
	var name, inbox string
	s := testService(&got, func(ctx context.Context, nc *nats.Conn) error {
		name, inbox = nc.Opts.Name, nc.Opts.InboxPrefix
		if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
			return err
		}
		<-ctx.Done() // the signal context; a lost signal times the test out
		return ctx.Err()
	})
	var stderr bytes.Buffer
	if code := s.exitCode([]string{"--value", "from-flag"}, &stderr); code != 0 {
		t.Fatalf("exit code = %d, want 0 after SIGTERM (stderr %q)", code, stderr.String())
	}
	if got.Value != "from-flag" || !got.Prepared {
		t.Errorf("Run got %+v, want the flag's value, prepared", got)
	}
	if name != "floe-svctest" || inbox != "_INBOX.svctest" {
		t.Errorf("connection name %q inbox %q, want floe-svctest and _INBOX.svctest", name, inbox)
	}

	// Without the flag the variable wins over the default; an error from
	// Run is the main's.
	got = testConfig{}
	if code := testService(&got, nil).exitCode(nil, &stderr); code != 1 || got.Value != "from-env" {
		t.Errorf("exit code %d, Run got %+v; want 1 and the variable's value", code, got)
	}
	if !strings.Contains(stderr.String(), "svctest: Run was called") {
		t.Errorf("stderr = %q, want Run's error", stderr.String())
	}
}
