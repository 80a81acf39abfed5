package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
)

// loggedGateway is a gateway whose log the test reads.
func loggedGateway(t *testing.T, env *bustest.Env, configure func(*gateway.Config)) (url string, logs *bustest.Buffer) {
	t.Helper()
	cfg := testConfig(t.TempDir())
	if configure != nil {
		configure(&cfg)
	}
	logs = &bustest.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, release, err := gateway.NewHandler(ctx, bustest.Connect(t, env.Server), cfg, zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.CloseClientConnections(); release(); srv.Close() })
	return srv.URL, logs
}

// from returns an HTTP client whose connections come from the loopback
// address ip (any of 127/8 can be bound on Linux): another client address.
func from(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

func login(t *testing.T, c *http.Client, url, token string) *http.Response {
	t.Helper()
	return postJSON(t, c, url+"/api/login", fmt.Sprintf(`{"token":%q}`, token), nil)
}

func cookieOf(r *http.Response) *http.Cookie {
	for _, c := range r.Cookies() {
		if c.Name == "floe_session" {
			return c
		}
	}
	return nil
}

// withCookie sends a GET /api/sessions carrying the cookie value.
func withCookie(t *testing.T, url, value string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/api/sessions", nil)
	req.AddCookie(&http.Cookie{Name: "floe_session", Value: value})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// The cookie is a random value naming a sign-in kept in the floe_signins
// bucket: never the token, different at each sign-in, worthless after
// sign-out, after its expiry and once its token is no longer configured.
func TestSignInIsAServerSideSession(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	kv, err := env.JS.KeyValue(ctxT(t), omni.SignInsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := kv.Status(ctxT(t)); st.TTL() != bus.SignInTTL {
		t.Errorf("sign-in bucket TTL %v, want %v", st.TTL(), bus.SignInTTL)
	}
	c1, c2 := cookieOf(login(t, http.DefaultClient, g.URL, aliceToken)), cookieOf(login(t, http.DefaultClient, g.URL, aliceToken))
	if c1 == nil || c2 == nil || c1.Value == c2.Value || strings.Contains(c1.Value, aliceToken) || len(c1.Value) < 40 {
		t.Fatalf("cookies %+v and %+v: want two different random values", c1, c2)
	}
	if c1.Secure || c1.MaxAge != int(bus.SignInTTL/time.Second) || !c1.HttpOnly || c1.SameSite != http.SameSiteStrictMode {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, not Secure on plain http, Max-Age the TTL", c1)
	}
	sum := sha256.Sum256([]byte(c1.Value))
	if _, err := kv.Get(ctxT(t), hex.EncodeToString(sum[:])); err != nil {
		t.Fatalf("the sign-in is not stored under the cookie's hash: %v", err)
	}
	for _, c := range []*http.Cookie{c1, c2} {
		if st := withCookie(t, g.URL, c.Value); st != http.StatusOK {
			t.Fatalf("GET with a fresh cookie = %d", st)
		}
	}
	// Sign-out deletes the sign-in: the cookie replayed afterwards is refused.
	req, _ := http.NewRequest("POST", g.URL+"/api/logout", nil)
	req.Header.Set("Content-Type", "application/json")
	req.AddCookie(c1)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("logout: %v %v", resp, err)
	}
	resp.Body.Close()
	if st := withCookie(t, g.URL, c1.Value); st != http.StatusUnauthorized {
		t.Errorf("the signed-out cookie replayed = %d, want 401", st)
	}
	if _, err := kv.Get(ctxT(t), hex.EncodeToString(sum[:])); err == nil {
		t.Error("the signed-out sign-in is still stored")
	}
	if st := withCookie(t, g.URL, c2.Value); st != http.StatusOK {
		t.Errorf("the other sign-in after one sign-out = %d, want 200", st)
	}
	for _, forged := range []string{"", "x", strings.Repeat("A", 43), c2.Value + "A"} {
		if st := withCookie(t, g.URL, forged); st != http.StatusUnauthorized {
			t.Errorf("forged cookie %q = %d, want 401", forged, st)
		}
	}
	// An expired entry (the bucket's max age removes it; the gateway also
	// checks the time it holds).
	tokSum := sha256.Sum256([]byte(aliceToken))
	old, _ := omni.Pack(map[string]any{"principal": "alice", "token_hash": tokSum[:], "expires_unix_ms": time.Now().Add(-time.Minute).UnixMilli()})
	const oldValue = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	oldSum := sha256.Sum256([]byte(oldValue))
	if _, err := kv.Put(ctxT(t), hex.EncodeToString(oldSum[:]), old); err != nil {
		t.Fatal(err)
	}
	if st := withCookie(t, g.URL, oldValue); st != http.StatusUnauthorized {
		t.Errorf("an expired sign-in = %d, want 401", st)
	}
	// The token removed from the configuration ends its sign-ins.
	g.cfg.Tokens = map[string]string{bobToken: "bob"}
	g.swap(t)
	if st := withCookie(t, g.URL, c2.Value); st != http.StatusUnauthorized {
		t.Errorf("a sign-in whose token was removed = %d, want 401", st)
	}
}

func TestSignInCookieIsSecureBehindHTTPS(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", func(c *gateway.Config) { c.PublicURL = "https://floe.example.com" })
	if c := cookieOf(login(t, http.DefaultClient, g.URL, aliceToken)); c == nil || !c.Secure {
		t.Fatalf("cookie behind an https public URL = %+v, want Secure", c)
	}
}

// Failed attempts are limited per client address (sign-in and bearer
// alike; the right token from a locked-out address waits too) and per
// claimed principal (across addresses), answered 429 with Retry-After,
// and logged without the token.
func TestFailedSignInsAreRateLimited(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	url, logs := loggedGateway(t, env, nil)
	a := from("127.0.0.11")
	var codes []int
	for i := range 12 {
		codes = append(codes, login(t, a, url, fmt.Sprintf("wrong-secret-%d", i)).StatusCode)
	}
	want := []int{401, 401, 401, 401, 401, 401, 401, 401, 401, 401, 429, 429}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Fatalf("12 wrong tokens from one address: %v, want %v", codes, want)
	}
	r := login(t, a, url, aliceToken)
	if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
		t.Fatalf("the right token from the locked-out address = %d (Retry-After %q), want 429 with Retry-After", r.StatusCode, r.Header.Get("Retry-After"))
	}
	bearer := func(c *http.Client, tok string) int {
		req, _ := http.NewRequest("GET", url+"/api/sessions", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := bearer(a, aliceToken); st != http.StatusTooManyRequests {
		t.Errorf("bearer from the locked-out address = %d, want 429", st)
	}
	// Another address is not affected; its bearer failures count too.
	b := from("127.0.0.12")
	if st := bearer(b, aliceToken); st != http.StatusOK {
		t.Errorf("the right bearer from another address = %d, want 200", st)
	}
	for range 10 {
		bearer(b, "wrong-bearer-secret")
	}
	if st := bearer(b, aliceToken); st != http.StatusTooManyRequests {
		t.Errorf("after 10 wrong bearers the address = %d, want 429", st)
	}
	// Per principal: "alice:..." guesses from many addresses lock alice's
	// claims out, not bare tokens.
	var last int
	for i := range 21 {
		last = login(t, from(fmt.Sprintf("127.0.1.%d", i+1)), url, fmt.Sprintf("alice:guess-%d", i)).StatusCode
	}
	if last != http.StatusTooManyRequests {
		t.Errorf("the 21st alice: guess from a fresh address = %d, want 429", last)
	}
	if st := login(t, from("127.0.2.1"), url, "bare-wrong").StatusCode; st != http.StatusUnauthorized {
		t.Errorf("a bare wrong token from a fresh address = %d, want 401", st)
	}
	if st := login(t, from("127.0.2.2"), url, aliceToken).StatusCode; st != http.StatusNoContent {
		t.Errorf("alice's bare token from a fresh address = %d, want 204", st)
	}
	out := logs.String()
	if !strings.Contains(out, "authentication failed") || !strings.Contains(out, "too many failed sign-in attempts") || !strings.Contains(out, "127.0.0.11") {
		t.Errorf("the failures and the lock-out are not logged with the address:\n%s", out)
	}
	for _, secret := range []string{"wrong-secret", "wrong-bearer-secret", "guess-", "bare-wrong", aliceToken} {
		if strings.Contains(out, secret) {
			t.Errorf("the log holds the token %q", secret)
		}
	}
	if n := strings.Count(out, "too many failed sign-in attempts"); n > 4 {
		t.Errorf("lock-out logged %d times; want once per lock-out", n)
	}
}
