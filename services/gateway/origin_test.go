package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// browserReq sends a request with the given Host and extra headers and
// returns its status and error code.
func browserReq(t *testing.T, g *testGateway, method, path, host, token, body string, hdr map[string]string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequestWithContext(ctxT(t), method, g.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb client.ErrorBody
	json.Unmarshal(b, &eb)
	if resp.StatusCode >= 400 && eb.Error.Message == "" {
		t.Fatalf("%s %s: %d with body %q, want the error shape", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, eb.Error.Code
}

// A page on a name that re-resolves to this machine (DNS rebinding) sends
// its own name as Host: every route refuses it, with tokens or without;
// loopback names, the public URL's host and FLOE_ALLOWED_HOSTS pass.
func TestForgedHostIsRefused(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	for _, auth := range []bool{false, true} {
		g := startGateway(t, env, "", func(c *gateway.Config) {
			if !auth {
				c.Tokens = nil
			}
			c.PublicURL = "https://floe.example.com"
			c.AllowedHosts = []string{"floe.internal", ".corp.example"}
		})
		tok := ""
		if auth {
			tok = aliceToken
		}
		js := map[string]string{"Content-Type": "application/json"}
		for _, host := range []string{"rebind.attacker.example:7364", "rebind.attacker.example", "127.0.0.1.nip.io", "corp.example.evil", "floe.example.com.evil", "[::2]"} {
			for _, rt := range []struct{ method, path, body string }{
				{"GET", "/api/sessions", ""},
				{"POST", "/api/sessions", "{}"},
				{"GET", "/", ""},
				{"GET", "/metrics", ""},
				{"POST", "/api/traces/import", `{"dataBase64":""}`},
				{"POST", "/api/some-later-route", "{}"},
			} {
				if st, code := browserReq(t, g, rt.method, rt.path, host, tok, rt.body, js); st != http.StatusForbidden || code != omni.CodeForbidden {
					t.Errorf("auth=%v Host %q: %s %s = %d %q, want 403 forbidden", auth, host, rt.method, rt.path, st, code)
				}
			}
		}
		if st, _ := browserReq(t, g, "GET", "/healthz", "rebind.attacker.example", "", "", nil); st != http.StatusOK {
			t.Errorf("auth=%v: /healthz with any Host = %d, want 200", auth, st)
		}
		for _, host := range []string{"127.0.0.1:1", "localhost:7364", "LOCALHOST.", "[::1]:80", "app.localhost", "floe.example.com", "floe.internal:8443", "a.corp.example", "127.0.0.2"} {
			if st, code := browserReq(t, g, "GET", "/api/sessions", host, tok, "", nil); st != http.StatusOK {
				t.Errorf("auth=%v Host %q: GET /api/sessions = %d %q, want 200", auth, host, st, code)
			}
		}
		if l, err := client.New(g.URL, client.WithToken(tok)).ListSessions(ctxT(t)); err != nil || len(l) != 0 {
			t.Errorf("auth=%v: a refused request created a Session: %v, %v", auth, l, err)
		}
	}
}

// A state-changing request a browser sent must be same-origin; a POST
// must say application/json even with no body (a cross-site fetch can
// send a body-less POST without a preflight). Non-browser clients send
// neither Origin nor Sec-Fetch-Site.
func TestCrossOriginWritesAreRefused(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	for _, auth := range []bool{false, true} {
		g := startGateway(t, env, "", func(c *gateway.Config) {
			if !auth {
				c.Tokens = nil
			}
			c.PublicURL = "https://floe.example.com"
		})
		tok := ""
		if auth {
			tok = aliceToken
		}
		c := client.New(g.URL, client.WithToken(tok))
		sess := createSession(t, c, client.CreateSession{})
		host := g.HTTP.Listener.Addr().String()
		refused := []struct {
			name, method, path, body string
			hdr                      map[string]string
			status                   int
		}{
			{"cross-site fetch, no body", "POST", "/api/sessions", "", map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}, 403},
			{"cross-site with JSON", "POST", "/api/sessions", "{}", map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json"}, 403},
			{"same-site other port", "POST", "/api/sessions/" + sess.ID + "/abort", "", map[string]string{"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site", "Content-Type": "application/json"}, 403},
			{"opaque origin", "POST", "/api/sessions/" + sess.ID + "/compact", "", map[string]string{"Origin": "null", "Content-Type": "application/json"}, 403},
			{"Sec-Fetch-Site only", "DELETE", "/api/sessions/" + sess.ID, "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
			{"PATCH cross-origin", "PATCH", "/api/sessions/" + sess.ID, `{"title":"x"}`, map[string]string{"Origin": "https://floe.example.com.evil", "Content-Type": "application/json"}, 403},
			{"abort without JSON type", "POST", "/api/sessions/" + sess.ID + "/abort", "", nil, 415},
			{"create as text/plain", "POST", "/api/sessions", "{}", map[string]string{"Content-Type": "text/plain"}, 415},
			{"create with no type", "POST", "/api/sessions", "", nil, 415},
			{"import as form", "POST", "/api/traces/import", "dataBase64=", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		}
		for _, tt := range refused {
			if st, _ := browserReq(t, g, tt.method, tt.path, "", tok, tt.body, tt.hdr); st != tt.status {
				t.Errorf("auth=%v %s: %s %s = %d, want %d", auth, tt.name, tt.method, tt.path, st, tt.status)
			}
		}
		if l, err := c.ListSessions(ctxT(t)); err != nil || len(l) != 1 || l[0].Title != sess.Title {
			t.Fatalf("auth=%v: after refused writes the list is %+v, %v; want the one Session unchanged", auth, l, err)
		}
		allowed := []struct {
			name string
			hdr  map[string]string
		}{
			{"same origin", map[string]string{"Origin": "http://" + host, "Sec-Fetch-Site": "same-origin"}},
			{"public URL origin", map[string]string{"Origin": "https://floe.example.com"}},
			{"no browser headers", nil},
		}
		for _, tt := range allowed {
			h := map[string]string{"Content-Type": "application/json"}
			for k, v := range tt.hdr {
				h[k] = v
			}
			if st, code := browserReq(t, g, "POST", "/api/sessions", "", tok, "{}", h); st != http.StatusCreated {
				t.Errorf("auth=%v %s: POST /api/sessions = %d %q, want 201", auth, tt.name, st, code)
			}
		}
	}
}

func TestAllowedHostsConfig(t *testing.T) {
	for _, tt := range []struct {
		name    string
		tokens  bool
		public  string
		allowed []string
		ok      bool
	}{
		{"star without tokens", false, "", []string{"*"}, false},
		{"star with tokens", true, "", []string{"*"}, true},
		{"a path", false, "", []string{"a/b"}, false},
		{"public URL not http", false, "ftp://x", nil, false},
		{"public URL without host", false, "https://", nil, false},
		{"names", false, "https://floe.example.com", []string{"floe.internal", ".corp.example"}, true},
	} {
		cfg := testConfig(t.TempDir())
		if !tt.tokens {
			cfg.Tokens = nil
		}
		cfg.PublicURL, cfg.AllowedHosts = tt.public, tt.allowed
		if err := cfg.Validate(); (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
	cfg, err := gateway.FromEnv(func(k string) string {
		return map[string]string{"FLOE_ALLOWED_HOSTS": " a.example, ,.b.example ", "FLOE_PUBLIC_URL": "https://p.example/"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.AllowedHosts) != 2 || cfg.AllowedHosts[0] != "a.example" || cfg.AllowedHosts[1] != ".b.example" || cfg.PublicURL != "https://p.example/" {
		t.Errorf("FromEnv = %q %q", cfg.AllowedHosts, cfg.PublicURL)
	}
}
