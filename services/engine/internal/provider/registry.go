// Package provider resolves a model reference "provider:model_id" to a
// model.Provider: openai, anthropic or scripted (protocol.md §6).
package provider

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/anthropic"
	"floe.dev/services/engine/internal/provider/openai"
	"floe.dev/services/engine/internal/provider/replay"
	"floe.dev/services/engine/internal/provider/scripted"
)

// Config holds provider credentials and endpoints.
type Config struct {
	OpenAIBaseURL    string
	OpenAIAPIKey     string
	AnthropicBaseURL string
	AnthropicAPIKey  string
	// RequestTimeout is the per-request idle timeout.
	RequestTimeout time.Duration
	// ReplayWait paces the replay provider (replay:<trace path>, floe
	// replay --execute) to the replayed Session's Trace; nil: no pacing.
	ReplayWait replay.Wait
	// ReplayChildren gives the replay provider a subagent child's own
	// record (nil for a Session that is not one).
	ReplayChildren replay.Children
}

// Registry resolves and caches providers. Safe for concurrent use.
type Registry struct {
	cfg Config
	mu  sync.Mutex
	// scripted providers keep per-Session counters: one instance per name.
	scripted  map[string]*scripted.Provider
	replays   map[string]*replay.Provider
	openai    *openai.Provider
	anthropic *anthropic.Provider
}

// NewRegistry returns a Registry for cfg.
func NewRegistry(cfg Config) *Registry {
	return &Registry{cfg: cfg, scripted: make(map[string]*scripted.Provider)}
}

// Resolve returns the provider and model info of ref ("provider:model_id").
func (r *Registry) Resolve(ref string) (model.Provider, model.Info, error) {
	prov, id, ok := strings.Cut(ref, ":")
	if !ok || id == "" {
		return nil, model.Info{}, fmt.Errorf("model %q: want provider:model_id (openai:, anthropic: or scripted:)", ref)
	}
	switch prov {
	case "scripted":
		r.mu.Lock()
		defer r.mu.Unlock()
		p := r.scripted[id]
		if p == nil {
			var err error
			if p, err = scripted.Open(id); err != nil {
				return nil, model.Info{}, err
			}
			r.scripted[id] = p
		}
		return p, p.Info(), nil
	case "replay":
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.replays == nil {
			r.replays = make(map[string]*replay.Provider)
		}
		p := r.replays[id]
		if p == nil {
			var err error
			if p, err = replay.Open(id, r.cfg.ReplayWait); err != nil {
				return nil, model.Info{}, err
			}
			p.SetChildren(r.cfg.ReplayChildren)
			r.replays[id] = p
		}
		return p, p.Info(), nil
	default:
		return r.resolveHTTP(prov, id)
	}
}
