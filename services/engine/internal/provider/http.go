package provider

import (
	"fmt"

	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/anthropic"
	"floe.dev/services/engine/internal/provider/openai"
)

// resolveHTTP returns the (cached) provider of an HTTP API: one instance
// per provider so requests share a connection pool.
func (r *Registry) resolveHTTP(prov, id string) (model.Provider, model.Info, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch prov {
	case openai.Name:
		if r.openai == nil {
			r.openai = openai.New(openai.Config{BaseURL: r.cfg.OpenAIBaseURL, APIKey: r.cfg.OpenAIAPIKey, IdleTimeout: r.cfg.RequestTimeout})
		}
		return r.openai, r.openai.Info(id), nil
	case anthropic.Name:
		if r.anthropic == nil {
			r.anthropic = anthropic.New(anthropic.Config{BaseURL: r.cfg.AnthropicBaseURL, APIKey: r.cfg.AnthropicAPIKey, IdleTimeout: r.cfg.RequestTimeout})
		}
		return r.anthropic, r.anthropic.Info(id), nil
	}
	return nil, model.Info{}, fmt.Errorf("unknown model provider %q (want openai, anthropic or scripted)", prov)
}
