package telemetry

import (
	"strings"

	"go.opentelemetry.io/otel/attribute"
)

// The GenAI semantic conventions' attribute keys Floe sets (their current
// names; we keep our own constants so a semconv package move does not move
// the wire names), and Floe's own, under floe.*.
const (
	OperationName      = attribute.Key("gen_ai.operation.name")
	ProviderName       = attribute.Key("gen_ai.provider.name")
	ConversationID     = attribute.Key("gen_ai.conversation.id")
	AgentName          = attribute.Key("gen_ai.agent.name")
	AgentID            = attribute.Key("gen_ai.agent.id")
	RequestModel       = attribute.Key("gen_ai.request.model")
	ResponseModel      = attribute.Key("gen_ai.response.model")
	FinishReasons      = attribute.Key("gen_ai.response.finish_reasons")
	TimeToFirstChunk   = attribute.Key("gen_ai.response.time_to_first_chunk")
	InputTokens        = attribute.Key("gen_ai.usage.input_tokens")
	OutputTokens       = attribute.Key("gen_ai.usage.output_tokens")
	CacheReadTokens    = attribute.Key("gen_ai.usage.cache_read.input_tokens")
	CacheWriteTokens   = attribute.Key("gen_ai.usage.cache_creation.input_tokens")
	TokenType          = attribute.Key("gen_ai.token.type")
	ToolName           = attribute.Key("gen_ai.tool.name")
	ToolCallID         = attribute.Key("gen_ai.tool.call.id")
	ToolType           = attribute.Key("gen_ai.tool.type")
	ToolCallArguments  = attribute.Key("gen_ai.tool.call.arguments")
	ToolCallResult     = attribute.Key("gen_ai.tool.call.result")
	InputMessages      = attribute.Key("gen_ai.input.messages")
	OutputMessages     = attribute.Key("gen_ai.output.messages")
	SystemInstructions = attribute.Key("gen_ai.system_instructions")
	ErrorType          = attribute.Key("error.type")

	TaskID           = attribute.Key("floe.task.id")
	Attempt          = attribute.Key("floe.request.attempt")
	RetryReason      = attribute.Key("floe.request.retry_reason")
	RequestStatus    = attribute.Key("floe.request.status")
	ApprovalDecision = attribute.Key("floe.approval.decision")
	ToolStatus       = attribute.Key("floe.tool.status")
	SandboxBackend   = attribute.Key("floe.sandbox.backend")
	SandboxNetwork   = attribute.Key("floe.sandbox.network")
	RunnerID         = attribute.Key("floe.toolrunner.id")
	CompactionReason = attribute.Key("floe.compaction.reason")
	CompactionMode   = attribute.Key("floe.compaction.mode")
	CompactionStatus = attribute.Key("floe.compaction.status")
	TaskStatus       = attribute.Key("floe.task.status")
	ParentSessionID  = attribute.Key("floe.parent_session.id")
)

// Operation names (gen_ai.operation.name) and the span names built from
// them: "invoke_agent", "chat {model}", "execute_tool {name}".
const (
	OpInvokeAgent = "invoke_agent"
	OpChat        = "chat"
	OpExecuteTool = "execute_tool"
	OpCompaction  = "compaction"
)

// ChatSpanName is the span name of a model request.
func ChatSpanName(model string) string { return OpChat + " " + model }

// ToolSpanName is the span name of a tool call.
func ToolSpanName(tool string) string { return OpExecuteTool + " " + tool }

// Provider maps a Floe model reference's provider to gen_ai.provider.name:
// "openai" and "anthropic" are the conventions' own values; any other
// provider (scripted, replay) keeps its name.
func ProviderOf(ref string) (provider, model string) {
	p, m, ok := strings.Cut(ref, ":")
	if !ok {
		return "", ref
	}
	return p, m
}

// KV is an attribute, so callers need not import the attribute package.
type KV = attribute.KeyValue
