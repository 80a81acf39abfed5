// Package anthropic is the model provider for the Anthropic Messages API: it
// turns a model.Request into one streaming POST /v1/messages and the event
// stream (message_start, content_block_start/delta/stop, message_delta,
// message_stop, ping, error) into model.Deltas.
//
// Block numbers are the API's content block indexes. Thinking carries its
// signature as fidelity {"signature": "…"} on the block's End (a
// redacted_thinking block becomes an empty thinking block with fidelity
// {"redacted_data": "…"}); both are replayed verbatim in later requests, as
// the API requires. A stream without message_stop is malformed.
//
// The provider never retries; failures are *model.Error per protocol.md §6.
package anthropic

import (
	"context"
	"net/http"
	"time"

	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/sse"
	"floe.dev/services/engine/internal/provider/wirecache"
)

// DefaultBaseURL is used when Config.BaseURL is empty.
const DefaultBaseURL = "https://api.anthropic.com"

// DefaultMaxTokens is the output limit sent when Config.MaxTokens is zero.
const DefaultMaxTokens = 8192

// APIVersion is sent as the anthropic-version header.
const APIVersion = "2023-06-01"

// Name is the provider name in model references and session_meta.
const Name = "anthropic"

// Config configures a Provider.
type Config struct {
	// BaseURL is the API root without version (ANTHROPIC_BASE_URL);
	// default DefaultBaseURL. Requests go to BaseURL + "/v1/messages".
	BaseURL string
	// APIKey is sent as x-api-key (ANTHROPIC_API_KEY).
	APIKey string
	// HTTPClient sends requests; default sse.NewClient(): no overall
	// timeout, no retries.
	HTTPClient *http.Client
	// IdleTimeout fails a request with status timeout when no byte arrives
	// for this long, from connecting to the end of the stream
	// (FLOE_REQUEST_TIMEOUT_MS); default 120 s. Anthropic pings keep a
	// slow but live stream alive.
	IdleTimeout time.Duration
	// MaxTokens is max_tokens for the visible output; default
	// DefaultMaxTokens. With a thinking level, the thinking budget is added
	// on top.
	MaxTokens int
}

// Provider streams Messages API requests. It is safe for concurrent use.
type Provider struct {
	ep   sse.Endpoint
	max  int
	wire *wirecache.Cache // each Session's last request, encoded
}

var _ model.Provider = (*Provider)(nil)

// New returns a Provider for cfg, filling in defaults.
func New(cfg Config) *Provider {
	h := http.Header{"Anthropic-Version": {APIVersion}}
	if cfg.APIKey != "" {
		h.Set("X-Api-Key", cfg.APIKey)
	}
	p := &Provider{
		ep:   sse.NewEndpoint(cfg.BaseURL, DefaultBaseURL, "/v1/messages", h, cfg.HTTPClient, cfg.IdleTimeout),
		max:  cfg.MaxTokens,
		wire: wirecache.New(0, 0),
	}
	if p.max <= 0 {
		p.max = DefaultMaxTokens
	}
	return p
}

// Info describes modelID: provider "anthropic" and its context window,
// default 200000.
func (p *Provider) Info(modelID string) model.Info {
	return model.Info{Provider: Name, ModelID: modelID, ContextWindow: contextWindow(modelID)}
}

// Stream sends req and emits its output. Deltas emitted before a failure
// stay emitted; after a failure no block is ended. A cancelled ctx returns
// ctx.Err() wrapped; an error from emit is returned as is.
func (p *Provider) Stream(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	body, err := buildRequest(req, p.max, p.wire)
	if err != nil {
		return model.Result{}, err
	}
	resp, err := p.ep.Post(ctx, body)
	if err != nil {
		return model.Result{}, err
	}
	defer resp.Close()
	return decode(resp, req.IDs, emit)
}
