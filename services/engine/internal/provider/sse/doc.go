// Package sse is the transport shared by the HTTP model providers: it sends
// one streaming request with a per-request idle timeout, reads the response
// as Server-Sent Events, and maps transport and HTTP failures to the
// model.Error statuses of protocol.md §6. It knows no provider's stream format:
// the openai and anthropic packages decode the events; only the common
// shapes of error bodies are read here, for the error message.
package sse

import (
	psse "floe.dev/pkg/sse"
)

// MaxEventSize bounds one event's data (and one line). A provider that sends
// more in a single event is treated as a malformed stream rather than being
// allowed to grow memory without limit.
const MaxEventSize = psse.DefaultMaxEventSize
