package server

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/web"
)

// The Web App (protocol.md §3 "Browsers"): static files embedded in the binary,
// a cookie sign-in for browsers, and /api/events for the live session list.

// sessionCookie is the browser sign-in cookie: a random value naming a
// server-side sign-in (signin.go), HttpOnly and SameSite=Strict.
const sessionCookie = "floe_session"

// contentSecurityPolicy allows only the app's own scripts, styles and
// connections: no inline script, no eval, nothing from elsewhere.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// openRoutes answer without credentials: the app itself (it shows the
// sign-in form), sign-in and sign-out, and liveness.
var openRoutes = map[string]bool{
	"GET /healthz":     true,
	"GET /{$}":         true,
	"GET /app/":        true,
	"POST /api/login":  true,
	"POST /api/logout": true,
	// The A2A Agent Card is public: it says how to authenticate.
	"GET /.well-known/agent-card.json": true,
}

func (s *Server) webRoutes(m *http.ServeMux) {
	m.HandleFunc("GET /{$}", s.handleApp)
	m.HandleFunc("GET /app/", s.handleApp)
	m.HandleFunc("POST /api/login", s.serve(s.handleLogin))
	m.HandleFunc("POST /api/logout", s.serve(s.handleLogout))
	m.HandleFunc("GET /api/events", s.serve(s.handleEvents))
}

// staticFiles is the embedded app with a content hash per file (its ETag).
type staticFiles struct {
	once sync.Once
	fsys fs.FS
	etag map[string]string
}

var appFiles staticFiles

func (sf *staticFiles) load() {
	sf.once.Do(func() {
		sf.fsys = web.FS()
		sf.etag = map[string]string{}
		fs.WalkDir(sf.fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			b, err := fs.ReadFile(sf.fsys, p)
			if err == nil {
				sum := sha256.Sum256(b)
				sf.etag[p] = `"` + hex.EncodeToString(sum[:8]) + `"`
			}
			return nil
		})
	})
}

// handleApp serves index.html at / and the app's files under /app/, with
// the strict Content-Security-Policy, revalidated by ETag on every load.
func (s *Server) handleApp(w http.ResponseWriter, r *http.Request) {
	appFiles.load()
	name := "index.html"
	if r.URL.Path != "/" {
		name = path.Clean(strings.TrimPrefix(r.URL.Path, "/app/"))
	}
	etag, ok := appFiles.etag[name]
	if !ok || strings.HasPrefix(name, ".") {
		writeError(w, errorf(http.StatusNotFound, omni.CodeNotFound, "no file %s", r.URL.Path))
		return
	}
	b, err := fs.ReadFile(appFiles.fsys, name)
	if err != nil {
		writeError(w, internalError("read app file", err))
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", etag)
	ct := mime.TypeByExtension(path.Ext(name))
	switch path.Ext(name) {
	case ".js", ".mjs":
		ct = "text/javascript; charset=utf-8"
	case ".svg":
		ct = "image/svg+xml"
	}
	if ct == "" {
		ct = "application/octet-stream"
	}
	h.Set("Content-Type", ct)
	if match := r.Header.Get("If-None-Match"); match == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Write(b)
}

// loginRequest is the body of POST /api/login.
type loginRequest struct {
	Token string `json:"token"`
}

// handleLogin checks the token and sets the sign-in cookie: a random
// value naming a server-side sign-in (signin.go); 401 for a wrong token,
// 429 once the client address or claimed principal failed too often. With
// authentication off there is nothing to sign in to: 204 and no cookie.
func (s *Server) handleLogin(w http.ResponseWriter, r *http.Request) *apiError {
	var req loginRequest
	if e := s.decodeBody(w, r, &req, false); e != nil {
		return e
	}
	if !s.auth.enabled() {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	tok := strings.TrimSpace(req.Token)
	claimed := claimedPrincipal(tok)
	if s.limited(w, r, claimed) {
		return nil
	}
	who, hash, ok := s.auth.checkToken(tok)
	if !ok {
		s.failed(r, "sign-in", claimed)
		return errorf(http.StatusUnauthorized, omni.CodeUnauthorized, "wrong token")
	}
	if s.signIns == nil {
		return errorf(http.StatusServiceUnavailable, omni.CodeUnavailable, "browser sign-in is unavailable (no sign-in bucket); use the bearer header")
	}
	value, err := s.newSignIn(r.Context(), who, hash)
	if err != nil {
		return unavailable("store the sign-in", err)
	}
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: value, Path: "/", MaxAge: int(bus.SignInTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secureCookie(r),
	})
	s.log.Info().Str("principal", who).Str("client", r.RemoteAddr).Msg("signed in")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleLogout ends the sign-in (its server-side entry is deleted, so the
// cookie is worthless even if kept) and clears the cookie.
func (s *Server) handleLogout(w http.ResponseWriter, r *http.Request) *apiError {
	if c, err := r.Cookie(sessionCookie); err == nil && c.Value != "" && s.signIns != nil {
		if err := s.signIns.Purge(r.Context(), cookieKey(c.Value)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return unavailable("end the sign-in", err)
		}
	}
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secureCookie(r),
	})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// authenticate returns the caller's principal from the bearer header or,
// failing that, the sign-in cookie, and the principal a failed bearer
// token claims. A write carried by the cookie must come from the app's
// own origin: SameSite=Strict keeps other sites' requests from carrying
// it, and this check holds even where a browser does not honour SameSite.
func (s *Server) authenticate(r *http.Request) (who string, ok bool, claimed string) {
	if r.Header.Get("Authorization") != "" {
		who, ok = s.auth.check(r)
		if !ok {
			_, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			claimed = claimedPrincipal(strings.TrimSpace(tok))
		}
		return who, ok, claimed
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return "", false, ""
	}
	if !safeMethod(r.Method) && !sameOrigin(r) {
		return "", false, ""
	}
	who, ok = s.cookiePrincipal(r.Context(), c.Value)
	return who, ok, ""
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// sameOrigin reports whether a browser request comes from the page's own
// origin: Sec-Fetch-Site when the browser sends it, else Origin against
// Host. A request with neither is not a browser's and is refused with a
// cookie (non-browser clients use the bearer header).
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin"
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}
