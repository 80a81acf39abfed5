package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// Browser sign-in (issue 28 point 6, docs/security.md): the cookie is a
// random value; the gateway keeps, in the floe_signins KV bucket under the
// value's SHA-256, the principal and the SHA-256 of the token that signed
// in, with the bucket's max age as expiry. Sign-out deletes the entry, and
// a token removed from FLOE_API_TOKEN ends its sign-ins. Failed attempts
// (sign-in or bearer) are limited per client address and per claimed
// principal, and logged without the token.

// signInRecord is a sign-in's entry in the bucket.
type signInRecord struct {
	Principal string `msgpack:"principal"`
	TokenHash []byte `msgpack:"token_hash"`
	ExpiresMs int64  `msgpack:"expires_unix_ms"`
}

// openSignIns opens the sign-in bucket, creating it when the layout
// predates it; nil (cookie sign-in unavailable) when neither works.
func openSignIns(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) jetstream.KeyValue {
	kv, err := js.KeyValue(ctx, omni.SignInsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, bus.SignInsBucketConfig(bus.Config{}))
	}
	if err != nil {
		log.Warn().Err(err).Msg("browser sign-in unavailable: cannot open the sign-in bucket (floe setup creates it)")
		return nil
	}
	return kv
}

// cookieKey is the bucket key of a cookie value.
func cookieKey(value string) string {
	sum := sha256.Sum256([]byte(value))
	return hex.EncodeToString(sum[:])
}

// newSignIn stores a sign-in for principal and returns the cookie value.
func (s *Server) newSignIn(ctx context.Context, who string, tokenHash [sha256.Size]byte) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	value := base64.RawURLEncoding.EncodeToString(b)
	rec, err := omni.Pack(&signInRecord{Principal: who, TokenHash: tokenHash[:], ExpiresMs: time.Now().Add(bus.SignInTTL).UnixMilli()})
	if err != nil {
		return "", err
	}
	if _, err := s.signIns.Create(ctx, cookieKey(value), rec); err != nil {
		return "", fmt.Errorf("store sign-in: %w", err)
	}
	return value, nil
}

// cookiePrincipal returns the principal of a sign-in cookie: false for an
// unknown, expired or signed-out cookie, or one whose token is no longer
// configured.
func (s *Server) cookiePrincipal(ctx context.Context, value string) (string, bool) {
	if s.signIns == nil || len(value) != 43 { // 32 bytes, base64url without padding
		return "", false
	}
	e, err := s.signIns.Get(ctx, cookieKey(value))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Warn().Err(err).Msg("read sign-in failed")
		}
		return "", false
	}
	var rec signInRecord
	if omni.Unpack(e.Value(), &rec) != nil || time.Now().UnixMilli() >= rec.ExpiresMs || len(rec.TokenHash) != sha256.Size {
		return "", false
	}
	who, ok := s.auth.byHash([sha256.Size]byte(rec.TokenHash))
	if !ok || who != rec.Principal {
		return "", false
	}
	return who, true
}

// secureCookie reports whether the sign-in cookie is marked Secure: when
// the request came over TLS or the public URL is https (a TLS-terminating
// proxy in front).
func (s *Server) secureCookie(r *http.Request) bool {
	return r.TLS != nil || strings.HasPrefix(strings.ToLower(s.opts.PublicURL), "https://")
}

// Failed-attempt limits: a client address may fail addrBurst times at once
// and one more every failRefill; a claimed principal principalBurst times.
const (
	addrBurst      = 10
	principalBurst = 20
	failRefill     = 3 * time.Second
	maxLimited     = 1 << 16 // keys tracked; beyond, the quietest are forgotten
)

// failLimiter counts failed attempts per key in a leaky bucket: each
// failure adds one, one drains every refill, and a key at its burst is
// refused until one drains.
type failLimiter struct {
	mu     sync.Mutex
	levels map[string]*failLevel // guarded by mu
	refill time.Duration
	now    func() time.Time
}

type failLevel struct {
	level  float64
	at     time.Time
	burst  float64
	logged bool // the lock-out was logged
}

func newFailLimiter() *failLimiter {
	return &failLimiter{levels: map[string]*failLevel{}, refill: failRefill, now: time.Now}
}

// drain brings l's level to now; mu must be held.
func (f *failLimiter) drain(l *failLevel, now time.Time) {
	l.level = math.Max(0, l.level-float64(now.Sub(l.at))/float64(f.refill))
	l.at = now
}

// blocked returns how long key must wait when it is at its burst, and
// whether this is the first refusal of its lock-out (to log once).
func (f *failLimiter) blocked(key string) (wait time.Duration, first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.levels[key]
	if l == nil {
		return 0, false
	}
	f.drain(l, f.now())
	if l.level+1 <= l.burst {
		l.logged = false
		return 0, false
	}
	wait = time.Duration((l.level + 1 - l.burst) * float64(f.refill))
	first = !l.logged
	l.logged = true
	return wait, first
}

// fail records a failed attempt of key.
func (f *failLimiter) fail(key string, burst int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	l := f.levels[key]
	if l == nil {
		if len(f.levels) >= maxLimited {
			f.sweep(now)
		}
		l = &failLevel{at: now, burst: float64(burst)}
		f.levels[key] = l
	}
	f.drain(l, now)
	l.level++
}

// sweep forgets drained keys, and every key when that frees too little;
// mu must be held.
func (f *failLimiter) sweep(now time.Time) {
	for k, l := range f.levels {
		if f.drain(l, now); l.level == 0 {
			delete(f.levels, k)
		}
	}
	if len(f.levels) >= maxLimited*3/4 {
		clear(f.levels)
	}
}

// clientKey is the limiter key of a request's client address: the IP, an
// IPv6 address by its /64 (one host's share).
func clientKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return "addr:" + host
	}
	if ip.To4() == nil {
		ip = ip.Mask(net.CIDRMask(64, 128))
	}
	return "addr:" + ip.String()
}

// claimedPrincipal is the principal an attempt names: the name of a
// "name:token" entry pasted whole, or "" (a bare token names nobody).
func claimedPrincipal(tok string) string {
	name, _, ok := strings.Cut(tok, ":")
	if !ok || name == "" || len(name) > 64 {
		return ""
	}
	return name
}

// limited answers 429 when the request's client address (or the principal
// it claims) is locked out by failed attempts; true when it did.
func (s *Server) limited(w http.ResponseWriter, r *http.Request, claimed string) bool {
	keys := []string{clientKey(r)}
	if claimed != "" {
		keys = append(keys, "principal:"+claimed)
	}
	for _, k := range keys {
		wait, first := s.fails.blocked(k)
		if wait == 0 {
			continue
		}
		if first {
			s.log.Warn().Str("client", k).Str("path", r.URL.Path).Dur("retry_after", wait).Msg("too many failed sign-in attempts; refusing this client for now")
		}
		secs := int(math.Ceil(wait.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
		writeError(w, errorf(http.StatusTooManyRequests, omni.CodeRateLimited, "too many failed sign-in attempts; retry in %d s", max(secs, 1)))
		return true
	}
	return false
}

// failed records and logs a failed attempt (never the token).
func (s *Server) failed(r *http.Request, how, claimed string) {
	s.fails.fail(clientKey(r), addrBurst)
	if claimed != "" {
		s.fails.fail("principal:"+claimed, principalBurst)
	}
	s.metrics.signInFailures.WithLabelValues(how).Inc()
	s.log.Warn().Str("client", r.RemoteAddr).Str("path", r.URL.Path).Str("method", how).Str("claimed_principal", claimed).Msg("authentication failed")
}
