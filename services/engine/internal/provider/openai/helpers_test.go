package openai

import (
	"context"
	"fmt"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/providertest"
)

// The shared helpers (providertest) under this package's short names.
const bound = providertest.Bound

type (
	recorder  = providertest.Recorder
	sseServer = providertest.SSEServer
)

var (
	blockText    = providertest.BlockText
	endOf        = providertest.EndOf
	checkDeltas  = providertest.CheckDeltas
	refs         = providertest.Refs
	serve        = providertest.Serve
	stall        = providertest.Stall
	hijackClose  = providertest.HijackClose
	asModelError = providertest.AsModelError
)

// newSSEServer serves events with this provider's SSE framing.
func newSSEServer(t *testing.T, events ...string) *sseServer {
	t.Helper()
	return providertest.NewSSEServer(t, func(e string) string { return fmt.Sprintf("data: %s\n\n", e) }, events...)
}

// stream runs one request against p with a deadline of bound.
func stream(t *testing.T, p *Provider, req *model.Request) ([]model.Delta, model.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var rec recorder
	res, err := p.Stream(ctx, req, rec.Emit)
	if ctx.Err() != nil {
		t.Fatalf("Stream ran into the test bound of %s", bound)
	}
	return rec.All(), res, err
}

func simpleRequest() *model.Request {
	return &model.Request{SessionID: "s1", Model: "gpt-4o", Messages: refs(omni.UserText("hi")), IDs: &model.IDAllocator{}}
}
