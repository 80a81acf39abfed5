package server

import (
	"net"
	"net/http"
	"net/url"
	"strings"

	"floe.dev/pkg/omni"
)

// The browser door (issue 28, docs/security.md): every request passes
// through hostGuard before routing, so routes added later are covered too.
//
//   - Host must name this gateway: a loopback name or address, the listen
//     address, FLOE_PUBLIC_URL's host or an FLOE_ALLOWED_HOSTS entry. A page
//     on a name that re-resolves to 127.0.0.1 (DNS rebinding) sends its own
//     name as Host, and is refused before any route runs.
//   - A state-changing request (any method but GET, HEAD, OPTIONS) that a
//     browser sent must be same-origin: Sec-Fetch-Site same-origin or none,
//     and an Origin whose host is the request's Host or FLOE_PUBLIC_URL's.
//     Requests without either header are not a browser's (curl, the Go
//     client) and pass on to authentication.
//   - POST, PUT and PATCH must say Content-Type: application/json, body or
//     not: a cross-site fetch can send a body-less POST without a preflight,
//     never one with that type.

// hostGuard holds the Host names the gateway answers to.
type hostGuard struct {
	any       bool            // FLOE_ALLOWED_HOSTS "*": every Host (tokens required)
	names     map[string]bool // exact names, lower case, no port
	suffixes  []string        // ".example.com" entries: subdomains of example.com
	publicURL *url.URL        // nil when unset
}

// newHostGuard builds the guard from the listen address, the public URL and
// the allowed list (validated by the gateway's Config).
func newHostGuard(addr, publicURL string, allowed []string) *hostGuard {
	g := &hostGuard{names: map[string]bool{"localhost": true}}
	if h, _, err := net.SplitHostPort(addr); err == nil && h != "" {
		if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
			// Bound to every interface: the addresses of this machine's
			// interfaces are its names (an IP literal cannot be rebound).
			if addrs, err := net.InterfaceAddrs(); err == nil {
				for _, a := range addrs {
					if n, ok := a.(*net.IPNet); ok {
						g.names[n.IP.String()] = true
					}
				}
			}
		} else {
			g.names[normHost(h)] = true
		}
	}
	if publicURL != "" {
		if u, err := url.Parse(publicURL); err == nil && u.Host != "" {
			g.publicURL = u
			g.names[normHost(u.Hostname())] = true
		}
	}
	for _, a := range allowed {
		a = strings.ToLower(strings.TrimSpace(a))
		switch {
		case a == "":
		case a == "*":
			g.any = true
		case strings.HasPrefix(a, "."):
			g.suffixes = append(g.suffixes, a)
		default:
			g.names[normHost(a)] = true
		}
	}
	return g
}

// normHost lower-cases a host name and drops an IPv6 literal's brackets
// and a trailing dot, so "LOCALHOST.", "[::1]" and "::1" compare equal.
func normHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return h
}

// hostOf returns the name part of a Host header (port dropped).
func hostOf(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return normHost(h)
	}
	return normHost(hostport)
}

// allowedHost reports whether a Host header names this gateway. Ports are
// not compared: a rebinding page reaches the right port under its own name.
func (g *hostGuard) allowedHost(hostport string) bool {
	if g.any {
		return true
	}
	h := hostOf(hostport)
	if h == "" {
		return false
	}
	if g.names[h] || strings.HasSuffix(h, ".localhost") {
		return true // *.localhost resolves to loopback in browsers, never by DNS
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, s := range g.suffixes {
		if strings.HasSuffix(h, s) {
			return true
		}
	}
	return false
}

// sameOriginWrite reports whether a state-changing request is allowed by
// its browser headers, and why not.
func (g *hostGuard) sameOriginWrite(r *http.Request) (bool, string) {
	switch site := strings.ToLower(r.Header.Get("Sec-Fetch-Site")); site {
	case "", "same-origin", "none":
	default:
		return false, "cross-site request refused (Sec-Fetch-Site: " + site + ")"
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true, ""
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false, "cross-origin request refused (Origin: " + truncate(o, 100) + ")"
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true, ""
	}
	if p := g.publicURL; p != nil && strings.EqualFold(u.Scheme, p.Scheme) && strings.EqualFold(u.Host, p.Host) {
		return true, ""
	}
	return false, "cross-origin request refused (Origin: " + truncate(o, 100) + ")"
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// check answers the request with an error and returns false when the
// browser-door rules refuse it; pattern is its route ("" when none).
func (g *hostGuard) check(w http.ResponseWriter, r *http.Request, pattern string) bool {
	if pattern == "GET /healthz" {
		return true // liveness probes name the pod's address; it tells nothing
	}
	if !g.allowedHost(r.Host) {
		writeError(w, errorf(http.StatusForbidden, omni.CodeForbidden,
			"host %q is not one this gateway serves (add it to FLOE_ALLOWED_HOSTS or set FLOE_PUBLIC_URL)", truncate(r.Host, 100)))
		return false
	}
	if safeMethod(r.Method) {
		return true
	}
	if ok, why := g.sameOriginWrite(r); !ok {
		writeError(w, errorf(http.StatusForbidden, omni.CodeForbidden, "%s", why))
		return false
	}
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		if pattern == "" {
			return true // unmatched: 404 or 405
		}
		if !isJSON(r.Header.Get("Content-Type")) {
			writeError(w, errorf(http.StatusUnsupportedMediaType, omni.CodeUnsupportedMedia,
				"request body must be application/json (send Content-Type: application/json, even with no body)"))
			return false
		}
	}
	return true
}
