package sse

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// DefaultIdleTimeout is the idle timeout used when none is configured.
const DefaultIdleTimeout = 120 * time.Second

// MaxMessage bounds the provider error text carried in a model.Error.
const MaxMessage = 500

// maxErrorBody bounds how much of a rejected response's body is read.
const maxErrorBody = 64 << 10

// errIdle is the cancellation cause when no byte arrived for the idle timeout.
var errIdle = errors.New("idle timeout")

// NewClient returns an HTTP client for streaming requests: no overall
// timeout (a stream may legitimately run for many minutes; the idle timeout
// of Open bounds silence instead) and a transport cloned from
// http.DefaultTransport, so proxy settings from the environment apply. The
// transport never replays a POST, so there are no retries.
func NewClient() *http.Client {
	return &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
}

// Body is the body of a successful streaming response. Every byte read
// re-arms the idle timer. Read errors other than io.EOF are already mapped:
// a *model.Error with status timeout for an idle timeout or a lost
// connection, or ctx.Err() wrapped when the caller's context ended.
type Body struct {
	rc        io.ReadCloser
	timer     *time.Timer
	idle      time.Duration
	parentErr func() error // the caller's ctx.Err
	cause     func() error // context.Cause of the request's context
	cancel    context.CancelCauseFunc
}

// Open sends req (its context is replaced) and returns the body of a 2xx
// response. idle bounds the time without any byte, from connecting through
// the end of the body; zero means DefaultIdleTimeout. Any failure to get a
// 2xx response is returned mapped per protocol.md §6 (see Classify and
// StatusForHTTP); a cancelled ctx returns ctx.Err() wrapped. The caller must
// Close the Body.
func Open(ctx context.Context, client *http.Client, req *http.Request, idle time.Duration) (*Body, error) {
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	rctx, cancel := context.WithCancelCause(ctx)
	b := &Body{
		idle:      idle,
		parentErr: ctx.Err,
		cause:     func() error { return context.Cause(rctx) },
		cancel:    cancel,
	}
	b.timer = time.AfterFunc(idle, func() { cancel(errIdle) })
	resp, err := client.Do(req.WithContext(rctx))
	if err != nil {
		b.stop()
		return nil, b.classify(err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, _ := io.ReadAll(io.LimitReader(&Body{rc: resp.Body, timer: b.timer, idle: idle}, maxErrorBody))
		resp.Body.Close()
		b.stop()
		return nil, HTTPError(resp.StatusCode, body)
	}
	b.rc = resp.Body
	return b, nil
}

// Read reads from the response body, re-arming the idle timer.
func (b *Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.timer.Reset(b.idle)
	}
	if err != nil && err != io.EOF && b.cause != nil {
		err = b.classify(err)
	}
	return n, err
}

// Close releases the response and stops the idle timer.
func (b *Body) Close() error {
	b.stop()
	return b.rc.Close()
}

func (b *Body) stop() {
	b.timer.Stop()
	b.cancel(context.Canceled)
}

// classify maps an error from sending the request or reading the body.
func (b *Body) classify(err error) error {
	if perr := b.parentErr(); perr != nil {
		return fmt.Errorf("model stream: %w", perr)
	}
	if errors.Is(b.cause(), errIdle) {
		return &model.Error{Status: omni.StatusTimeout, Message: fmt.Sprintf("no data from provider for %s", b.idle)}
	}
	return Classify(err)
}

// Classify maps a transport error (not a cancelled context) to a
// *model.Error. Refused, reset and dropped connections, DNS failures and
// unexpected ends of the body are timeout: the network may recover and the
// engine's retry ladder applies. Failures that cannot heal by retrying — an
// untrusted certificate, an unsupported URL scheme — are failed.
func Classify(err error) *model.Error {
	var (
		certErr    *tls.CertificateVerificationError
		unknownCA  x509.UnknownAuthorityError
		hostErr    x509.HostnameError
		invalidErr x509.CertificateInvalidError
	)
	msg := Truncate(err.Error())
	switch {
	case errors.As(err, &certErr), errors.As(err, &unknownCA), errors.As(err, &hostErr), errors.As(err, &invalidErr),
		strings.Contains(err.Error(), "unsupported protocol scheme"):
		return &model.Error{Status: omni.StatusFailed, Message: msg}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		msg = "connection lost mid-stream: " + msg
	}
	if u, ok := refusedLocally(err); ok {
		// A model server on this machine (OPENAI_BASE_URL pointing at a
		// local one) that is not running: one retry, then the Task
		// fails naming it, instead of a minute of retries.
		return &model.Error{Status: omni.StatusTimeout, MaxRetries: 1,
			Message: "connection refused by the model server at " + u + " (is it running?)"}
	}
	return &model.Error{Status: omni.StatusTimeout, Message: msg}
}

// refusedLocally reports a connection refused by a loopback address, and
// the URL that was asked.
func refusedLocally(err error) (string, bool) {
	var ue *url.Error
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &ue) {
		return "", false
	}
	u, perr := url.Parse(ue.URL)
	if perr != nil {
		return "", false
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
		return "", false
	}
	u.RawQuery, u.User = "", nil
	return u.String(), true
}

// StatusForHTTP maps a rejected response to a stop reason (protocol.md §6): 401, or
// 403 whose body says the credential is invalid, is auth; 408, 429 and 5xx
// (529 overloaded included) are timeout; anything else — 400, a bare 403,
// 404, 413… — is failed.
func StatusForHTTP(code int, body []byte) string {
	switch {
	case code == http.StatusUnauthorized:
		return omni.StatusAuth
	case code == http.StatusForbidden && CredentialInvalid(body):
		return omni.StatusAuth
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests, code >= 500 && code <= 599:
		return omni.StatusTimeout
	}
	return omni.StatusFailed
}

// HTTPError builds the *model.Error for a rejected response.
func HTTPError(code int, body []byte) *model.Error {
	msg := ErrorText(body)
	if msg == "" {
		msg = http.StatusText(code)
	}
	return &model.Error{Status: StatusForHTTP(code, body), Message: msg, HTTPStatus: code}
}

// credentialPhrases are lower-case fragments by which providers and the
// gateways in front of them say a credential itself is bad, as opposed to
// lacking permission for a model, region or feature (a bare 403).
var credentialPhrases = []string{
	"invalid api key", "invalid_api_key", "incorrect api key", "invalid x-api-key",
	"api key not valid", "api key is invalid", "api_key_invalid", "invalid key",
	"invalid token", "invalid access token", "invalid bearer token", "token is invalid",
	"token has expired", "token expired", "api key expired", "api key has expired", "expired api key",
	"invalid credential", "invalid authentication", "authentication_error", "unauthenticated",
	"key is disabled", "key has been disabled", "key has been revoked", "revoked api key",
	"invalid subscription key",
}

// CredentialInvalid reports whether a 403 body says the credential is
// invalid, expired or revoked.
func CredentialInvalid(body []byte) bool {
	s := strings.ToLower(string(body))
	for _, p := range credentialPhrases {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// ErrorText extracts a readable message from a provider error body:
// "type: message" from {"error":{"type","message"}} (OpenAI, Anthropic,
// OpenRouter), {"error":"…"} or {"message":"…"} (vLLM, Ollama); otherwise
// the body itself. The result is trimmed and truncated to MaxMessage bytes.
func ErrorText(body []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil {
		var obj struct {
			Type     string          `json:"type"`
			Code     json.RawMessage `json:"code"`
			Message  string          `json:"message"`
			Metadata struct {
				Raw          string `json:"raw"`
				ProviderName string `json:"provider_name"`
			} `json:"metadata"` // OpenRouter: the upstream provider's error
		}
		var str string
		switch {
		case json.Unmarshal(e.Error, &obj) == nil && obj.Message != "":
			msg := obj.Message
			kind := obj.Type
			if kind == "" && json.Unmarshal(obj.Code, &str) == nil {
				kind = str
			}
			if kind != "" {
				msg = kind + ": " + msg
			}
			if raw := obj.Metadata.Raw; raw != "" {
				msg += " (" + strings.TrimSpace(obj.Metadata.ProviderName+" "+raw) + ")"
			}
			return Truncate(msg)
		case json.Unmarshal(e.Error, &str) == nil && str != "":
			return Truncate(str)
		case e.Message != "":
			return Truncate(e.Message)
		}
	}
	return Truncate(strings.TrimSpace(string(body)))
}

// Truncate shortens s to at most MaxMessage bytes on a rune boundary,
// marking the cut with "…".
func Truncate(s string) string {
	if len(s) <= MaxMessage {
		return s
	}
	cut := MaxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Malformed returns a *model.Error with status malformed.
func Malformed(format string, args ...any) *model.Error {
	return &model.Error{Status: omni.StatusMalformed, Message: Truncate(fmt.Sprintf(format, args...))}
}
