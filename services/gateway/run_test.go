package gateway_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

func TestRunRefusesNonLoopbackWithoutToken(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.10:7364", "example.com:7364"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := gateway.Run(ctx, env.Conn, gateway.Config{Addr: addr, Home: t.TempDir()}, zerolog.Nop())
		cancel()
		if !errors.Is(err, gateway.ErrOpenWithoutToken) {
			t.Errorf("Run on %s without token = %v, want ErrOpenWithoutToken", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:7364", "localhost:7364", "[::1]:7364"} {
		cfg := gateway.Config{Addr: addr, Home: "/tmp"}
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate %s = %v, want loopback accepted", addr, err)
		}
	}
	cfg := gateway.Config{Addr: "0.0.0.0:7364", Home: "/tmp", Tokens: map[string]string{"t": "p"}}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate with token = %v", err)
	}
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestRunServesAndShutsDownGracefully(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	nc := bustest.Connect(t, env.Server)
	addr := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- gateway.Run(ctx, nc, gateway.Config{Addr: addr, Home: t.TempDir(), Tokens: map[string]string{aliceToken: "alice"}}, zerolog.Nop())
	}()
	c := client.New("http://"+addr, client.WithToken(aliceToken))
	eventually(t, "gateway up", func() bool { return c.Health(context.Background()) == nil })
	s := createSession(t, c, client.CreateSession{})
	col := openStream(t, c, s.ID, "")
	col.next()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after its context ended")
	}
	if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
		t.Fatal("still serving after shutdown")
	}
}
