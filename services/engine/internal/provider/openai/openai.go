// Package openai is the model provider for any OpenAI-compatible Chat
// Completions endpoint (OpenAI, DeepSeek, OpenRouter, vLLM, Ollama…): it
// turns a model.Request into one streaming POST /chat/completions and the
// streamed chunks into model.Deltas.
//
// Reasoning arrives in delta.reasoning_content (DeepSeek, older vLLM) or
// delta.reasoning (OpenRouter, Ollama, newer vLLM); it becomes thinking whose
// fidelity {"reasoning_field": "<field>"} says where to replay it, since
// DeepSeek requires the reasoning of tool-calling turns back in later
// requests. Parallel tool calls are assembled from index-keyed fragments,
// one block per call. Chat Completions has no per-block stop, so a block
// ends when the output moves on (thinking → text → tool calls), at
// finish_reason "tool_calls" (the calls are complete: the engine may run
// them even if the stream then breaks), or at "data: [DONE]"; a stream
// without [DONE] is malformed.
//
// The provider never retries; failures are *model.Error per protocol.md §6.
package openai

import (
	"context"
	"net/http"
	"time"

	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/sse"
	"floe.dev/services/engine/internal/provider/wirecache"
)

// DefaultBaseURL is used when Config.BaseURL is empty.
const DefaultBaseURL = "https://api.openai.com/v1"

// Name is the provider name in model references and session_meta.
const Name = "openai"

// Config configures a Provider. The zero value talks to api.openai.com
// without a key.
type Config struct {
	// BaseURL is the API root including the version, e.g.
	// "https://api.deepseek.com/v1" or "http://127.0.0.1:11434/v1"
	// (OPENAI_BASE_URL); default DefaultBaseURL. Requests go to
	// BaseURL + "/chat/completions".
	BaseURL string
	// APIKey is sent as "Authorization: Bearer <key>" when non-empty
	// (OPENAI_API_KEY).
	APIKey string
	// HTTPClient sends requests; default sse.NewClient(): no overall
	// timeout, no retries.
	HTTPClient *http.Client
	// IdleTimeout fails a request with status timeout when no byte arrives
	// for this long, from connecting to the end of the stream
	// (FLOE_REQUEST_TIMEOUT_MS); default 120 s.
	IdleTimeout time.Duration
	// MaxTokens, when positive, is sent as max_completion_tokens; by default
	// the server's own limit applies.
	MaxTokens int
}

// Provider streams Chat Completions. It is safe for concurrent use.
type Provider struct {
	ep   sse.Endpoint
	max  int
	wire *wirecache.Cache // each Session's last request, encoded
}

var _ model.Provider = (*Provider)(nil)

// New returns a Provider for cfg, filling in defaults.
func New(cfg Config) *Provider {
	h := http.Header{}
	if cfg.APIKey != "" {
		h.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	p := &Provider{
		ep:   sse.NewEndpoint(cfg.BaseURL, DefaultBaseURL, "/chat/completions", h, cfg.HTTPClient, cfg.IdleTimeout),
		max:  cfg.MaxTokens,
		wire: wirecache.New(0, 0),
	}
	return p
}

// Info describes modelID: provider "openai" and its context window from a
// table of known models (an OpenRouter-style "vendor/" prefix is ignored),
// default 128000.
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
