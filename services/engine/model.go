package engine

import (
	"fmt"
	"strings"
	"time"

	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider"
	"floe.dev/services/engine/internal/provider/scripted"
)

// ScriptedModelCPU is the CPU time the scripted models of this process
// spent on their own token estimate of the requests they were sent (a
// count over the whole request, O(context) as a real model's reading of
// it is): a benchmark that runs a scripted model inside its process
// subtracts it to see Floe's share (0 on systems other than Linux).
func ScriptedModelCPU() time.Duration { return scripted.ModelCPU() }

// ScriptedModelTime is the time the same estimates took: they are on a
// request's path, so a Task waits for them.
func ScriptedModelTime() time.Duration { return scripted.ModelTime() }

// TitleInstruction starts the text of the one-off request that names a
// Session after its first Task (protocol.md §3, session_title): a fake
// model server tells it from the agent loop's requests by it.
const TitleInstruction = model.TitleInstruction

// CheckModel reports, before anything starts, whether ref can be used by an
// engine with these provider settings: ref must be provider:model_id with a
// known provider, a scripted model must load (a script file must parse),
// and a hosted provider needs its API key unless its base URL points at an
// endpoint of the user's own (a local server may need none). The error is
// one line saying what to fix.
func CheckModel(p provider.Config, ref string) error {
	prov, id, ok := strings.Cut(ref, ":")
	if !ok || prov == "" || id == "" {
		return fmt.Errorf("model %q is not provider:model_id (e.g. openai:gpt-4o-mini, anthropic:claude-sonnet-4-5, scripted:demo)", ref)
	}
	switch prov {
	case "openai":
		if p.OpenAIAPIKey == "" && p.OpenAIBaseURL == "" {
			return fmt.Errorf("model %s needs OPENAI_API_KEY (or OPENAI_BASE_URL for a local OpenAI-compatible server)", ref)
		}
	case "anthropic":
		if p.AnthropicAPIKey == "" && p.AnthropicBaseURL == "" {
			return fmt.Errorf("model %s needs ANTHROPIC_API_KEY", ref)
		}
	case "scripted":
	default:
		return fmt.Errorf("model %s: unknown provider %q (want openai, anthropic or scripted)", ref, prov)
	}
	if _, _, err := provider.NewRegistry(p).Resolve(ref); err != nil {
		return fmt.Errorf("model %s: %w", ref, err)
	}
	return nil
}
