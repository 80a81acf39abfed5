package provider

import (
	"fmt"

	"floe.dev/services/engine/internal/model"
)

func (r *Registry) resolveHTTP(prov, id string) (model.Provider, model.Info, error) {
	return nil, model.Info{}, fmt.Errorf("unknown model provider %q (want openai, anthropic or scripted)", prov)
}
