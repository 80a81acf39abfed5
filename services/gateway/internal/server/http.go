package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path"
	"strings"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// apiError is what a handler answers when it fails: Status and Code reach
// the client, Err only the log (what the client sees is kept apart from what
// we log).
type apiError struct {
	Status  int
	Code    string
	Message string
	Err     error
}

func (e *apiError) Error() string {
	if e.Err != nil {
		return e.Code + ": " + e.Message + ": " + e.Err.Error()
	}
	return e.Code + ": " + e.Message
}

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func internalError(what string, err error) *apiError {
	return &apiError{Status: http.StatusInternalServerError, Code: omni.CodeInternal, Message: what + " failed", Err: err}
}

func unavailable(what string, err error) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Code: omni.CodeUnavailable, Message: what + ": the bus is unavailable, retry later", Err: err}
}

var errNotFound = errorf(http.StatusNotFound, omni.CodeNotFound, "session not found")

// writeJSON answers v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"encode response failed"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Status, client.ErrorBody{Error: client.ErrorDetail{Code: e.Code, Message: e.Message}})
}

// handlerFunc is an HTTP handler that returns its failure instead of
// writing it; serve writes and logs it once.
type handlerFunc func(w http.ResponseWriter, r *http.Request) *apiError

func (s *Server) serve(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		e := h(w, r)
		if e == nil {
			return
		}
		switch {
		case r.Context().Err() != nil:
			// The client went away (or stalled, or the server is
			// stopping): whatever failed failed because of that.
			s.log.Debug().Err(e.Err).Str("route", r.Pattern).Str("code", e.Code).Msg("client disconnected")
		case e.Status >= 500:
			s.log.Error().Err(e.Err).Str("route", r.Pattern).Str("session_id", r.PathValue("id")).Str("code", e.Code).Msg("request failed")
		case e.Err != nil:
			s.log.Debug().Err(e.Err).Str("route", r.Pattern).Str("code", e.Code).Msg("request rejected")
		}
		writeError(w, e)
	}
}

// decodeBody decodes a JSON request body into dst. Bodies must be JSON
// (415 otherwise), at most maxBody bytes (413), one value with no unknown
// fields (400). When optional, an empty body leaves dst as it is.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, dst any, optional bool) *apiError {
	return s.decodeBodyLimit(w, r, dst, optional, s.opts.MaxBody)
}

// decodeBodyLimit is decodeBody with its own cap on the body (a route
// that takes larger bodies, such as a Trace import).
func (s *Server) decodeBodyLimit(w http.ResponseWriter, r *http.Request, dst any, optional bool, limit int64) *apiError {
	if r.ContentLength > limit {
		return errorf(http.StatusRequestEntityTooLarge, omni.CodeTooLarge, "request body is larger than %d bytes", limit)
	}
	// A client that sends headers and then stalls (or trickles) its body
	// holds a connection and a goroutine: the body has ReadBodyTimeout.
	rc := http.NewResponseController(w)
	deadline := s.opts.ReadBodyTimeout > 0 && rc.SetReadDeadline(time.Now().Add(s.opts.ReadBodyTimeout)) == nil
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if deadline && err == nil {
		// Kept on failure: net/http drains what is left of the body of a
		// stalled client before it closes the connection.
		_ = rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errorf(http.StatusRequestEntityTooLarge, omni.CodeTooLarge, "request body is larger than %d bytes", limit)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.Header().Set("Connection", "close")
			return &apiError{Status: http.StatusRequestTimeout, Code: omni.CodeRequestTimeout,
				Message: fmt.Sprintf("request body not received within %v", s.opts.ReadBodyTimeout), Err: err}
		}
		return &apiError{Status: http.StatusBadRequest, Code: omni.CodeBadRequest, Message: "read request body failed", Err: err}
	}
	ct := r.Header.Get("Content-Type")
	empty := len(bytes.TrimSpace(body)) == 0
	if empty && optional && ct == "" {
		return nil
	}
	if !isJSON(ct) {
		return errorf(http.StatusUnsupportedMediaType, omni.CodeUnsupportedMedia, "request body must be application/json")
	}
	if empty {
		if optional {
			return nil
		}
		return errorf(http.StatusBadRequest, omni.CodeBadRequest, "request body is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return errorf(http.StatusBadRequest, omni.CodeBadRequest, "malformed JSON body: %s", jsonErrorText(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return errorf(http.StatusBadRequest, omni.CodeBadRequest, "malformed JSON body: trailing data after the value")
	}
	return nil
}

func jsonErrorText(err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		return fmt.Sprintf("field %q: expected %s", ute.Field, ute.Type)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// isJSON reports whether a Content-Type is application/json or a
// +json type, with any parameters.
func isJSON(ct string) bool {
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

type principalKey struct{}

// principal returns the caller's principal ("" when auth is off).
func principal(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(string)
	return p
}

// authenticator checks bearer tokens in constant time.
type authenticator struct {
	tokens []tokenEntry
}

type tokenEntry struct {
	hash      [sha256.Size]byte
	principal string
}

func newAuthenticator(tokens map[string]string) *authenticator {
	a := &authenticator{}
	for tok, p := range tokens {
		a.tokens = append(a.tokens, tokenEntry{hash: sha256.Sum256([]byte(tok)), principal: p})
	}
	return a
}

func (a *authenticator) enabled() bool { return len(a.tokens) > 0 }

// check returns the principal of the request's bearer token.
func (a *authenticator) check(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	who, _, ok := a.checkToken(strings.TrimSpace(tok))
	return who, ok
}

// checkToken returns the principal of tok and its hash.
func (a *authenticator) checkToken(tok string) (string, [sha256.Size]byte, bool) {
	if tok == "" {
		return "", [sha256.Size]byte{}, false
	}
	sum := sha256.Sum256([]byte(tok))
	who, ok := a.byHash(sum)
	return who, sum, ok
}

// byHash returns the principal of the token with this SHA-256. Every
// token is compared (hashes, so lengths leak nothing) whatever matches
// first.
func (a *authenticator) byHash(sum [sha256.Size]byte) (string, bool) {
	var who string
	ok := 0
	for i := range a.tokens {
		if subtle.ConstantTimeCompare(sum[:], a.tokens[i].hash[:]) == 1 {
			who = a.tokens[i].principal
			ok = 1
		}
	}
	return who, ok == 1
}

// statusRecorder captures the status for metrics; Unwrap keeps
// http.ResponseController (Flush, write deadlines) working through it.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

var probeMethods = []string{http.MethodGet, http.MethodPost, http.MethodPatch, http.MethodDelete, http.MethodPut}

// ServeHTTP routes a request: authentication, JSON 404/405 for unknown
// routes, then the route's handler; every request is counted by route
// pattern and status.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w}
	_, pattern := s.mux.Handler(r)
	if uncleanAPIPath(r.URL.Path) {
		pattern = "" // the mux would take it to another route (unmatched)
	}
	route := pattern
	if route == "" {
		route = "unmatched"
	}
	ctx, span := s.startSpan(r, route)
	r = r.WithContext(ctx)
	defer func() {
		st := rec.status
		if st == 0 {
			st = http.StatusOK
		}
		s.metrics.request(route, st)
		endSpan(span, st)
	}()
	if !s.guard.check(rec, r, pattern) {
		return
	}
	if pattern == "" {
		s.unmatched(rec, r)
		return
	}
	if !openRoutes[pattern] && s.auth.enabled() {
		if s.limited(rec, r, "") {
			return
		}
		who, ok, claimed := s.authenticate(r)
		if !ok {
			if r.Header.Get("Authorization") != "" {
				s.failed(r, "bearer", claimed)
			}
			rec.Header().Set("WWW-Authenticate", `Bearer realm="floe"`)
			writeError(rec, errorf(http.StatusUnauthorized, omni.CodeUnauthorized, "missing or invalid bearer token"))
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), principalKey{}, who))
	}
	s.mux.ServeHTTP(rec, r)
}

// uncleanAPIPath reports an API path with an empty, "." or ".." segment.
// The mux would clean it into another route: POST /api/sessions//fork
// into /api/sessions/fork (405, the Session "fork" takes no POST), GET
// /api/sessions//messages into a redirect to the Session "messages". No
// route has such a segment, so it is a 404 like any path no route takes.
func uncleanAPIPath(p string) bool {
	if !strings.HasPrefix(p, "/api/") {
		return false
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") {
		c += "/"
	}
	return c != p
}

// unmatched answers a request no route takes: 405 when the path exists
// with other methods, else 404.
func (s *Server) unmatched(w http.ResponseWriter, r *http.Request) {
	if uncleanAPIPath(r.URL.Path) {
		writeError(w, errorf(http.StatusNotFound, omni.CodeNotFound, "no route for %s %s: a path segment is empty, . or .. (a missing id?)", r.Method, r.URL.Path))
		return
	}
	var allow []string
	for _, m := range probeMethods {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, p := s.mux.Handler(probe); p != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, errorf(http.StatusMethodNotAllowed, omni.CodeBadRequest, "method %s not allowed on %s", r.Method, r.URL.Path))
		return
	}
	writeError(w, errorf(http.StatusNotFound, omni.CodeNotFound, "no route for %s %s", r.Method, r.URL.Path))
}
