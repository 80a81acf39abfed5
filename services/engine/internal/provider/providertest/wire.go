package providertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/wirecache"
)

// Wire is a provider's request body builder and what its wire tests need
// to know of the provider: docs/history-window.md "Model requests".
type Wire struct {
	// Build returns the body of req as the provider sends it, through
	// cache (nil: without one).
	Build func(req *model.Request, maxTokens int, cache *wirecache.Cache) ([]byte, error)
	// Whole returns the body as json.Marshal gives it of the whole
	// request: what Build must return, with or without a cache.
	Whole func(t testing.TB, req *model.Request, maxTokens int) []byte
	// Model names the model of the requests, System is their system
	// prompt; with OptionalSystem a third of the replayed requests have
	// none (where the system prompt is a message of the body).
	Model, System  string
	OptionalSystem bool
	// Thinking is the Fidelity of thinking this provider made, Foreign
	// that of another provider's (which sends nothing).
	Thinking, Foreign json.RawMessage
	// CallID formats a tool call's id from its step, FailedID a failed
	// output's (which may name no call of the context).
	CallID, FailedID string
	// InlineType and InlineData are an inline attachment's MIME type and
	// base64 data.
	InlineType, InlineData string
}

// message is any model message the context may hold, including ones that
// send nothing (empty text, thinking of another provider).
func (w *Wire) message(r *rand.Rand, i int) *omni.Message {
	var m omni.Message
	switch r.IntN(12) {
	case 0, 1, 2:
		m = omni.UserText(fmt.Sprintf("step %d <&> \"quoted\" é", i))
	case 3:
		m = omni.Text(omni.RoleAssistant, fmt.Sprintf("answer %d", i))
	case 4:
		m = omni.Text(omni.RoleAssistant, "")
	case 5:
		m = omni.Thinking(fmt.Sprintf("think %d", i))
		m.Payload.Fidelity = w.Thinking
	case 6:
		m = omni.Thinking("foreign")
		m.Payload.Fidelity = w.Foreign
	case 7:
		m = omni.ToolCall("read_file", fmt.Sprintf(`{"path":"%d.go"}`, i), fmt.Sprintf(w.CallID, i))
	case 8:
		m = omni.ToolCallOutput(fmt.Sprintf(w.CallID, i), fmt.Sprintf("output %d", i), "")
	case 9:
		m = omni.ToolCallOutput(fmt.Sprintf(w.FailedID, i), "exit status 1", omni.StatusFailed)
		m.Payload.Images = json.RawMessage(`["data:image/png;base64,AAAA"]`)
	case 10:
		m = omni.Model(omni.Payload{Type: omni.TypeImageURL, Role: omni.RoleUser, ImageURL: "https://example.com/a.png"})
	case 11:
		m = omni.Model(omni.Payload{Type: omni.TypeInlineData, Role: omni.RoleUser, MimeType: w.InlineType, Data: w.InlineData})
	}
	return &m
}

// CacheEqualsWhole replays Sessions whose context grows request by
// request (and sometimes gets a fresh copy of a message, an extra text at
// its end, a title request, or a compaction that starts it over) and
// compares every body built through the cache with the whole request
// marshalled at once.
func CacheEqualsWhole(t *testing.T, w Wire) {
	t.Helper()
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 27))
		cache := wirecache.New(0, 0)
		var ctx []*omni.Message
		hits := 0
		for i := range 200 {
			for range 1 + r.IntN(4) {
				ctx = append(ctx, w.message(r, i))
			}
			msgs := ctx
			switch r.IntN(10) {
			case 0: // carry-over: a new message in the middle
				at := r.IntN(len(ctx))
				msgs = append(append(append([]*omni.Message(nil), ctx[:at]...), new(omni.UserText("carried"))), ctx[at:]...)
			case 1: // a [turn_retried] block after the context
				msgs = append(append([]*omni.Message(nil), ctx...), new(omni.UserText("retried")))
			case 2: // a message folded again (another pointer, same content)
				j := r.IntN(len(ctx))
				cp := *ctx[j]
				ctx[j] = &cp
			case 3:
				if r.IntN(5) == 0 { // compaction: the context starts over
					ctx = ctx[len(ctx)-1:]
					msgs = ctx
				}
			}
			req := &model.Request{SessionID: fmt.Sprint("s", seed%3), Model: w.Model, Messages: msgs,
				Tools: []omni.ToolSpec{{Name: "read_file"}}}
			if !w.OptionalSystem || r.IntN(3) > 0 {
				req.SystemPrompt = w.System
			}
			if r.IntN(15) == 0 {
				req.Purpose = model.PurposeTitle
			}
			if r.IntN(4) == 0 {
				req.ThinkingLevel = "low"
			}
			if cache.Lookup(req.SessionID, msgs) != nil {
				hits++
			}
			got, err := w.Build(req, 1000, cache)
			if err != nil {
				t.Fatal(err)
			}
			if want := w.Whole(t, req, 1000); !bytes.Equal(got, want) {
				t.Fatalf("seed %d request %d: body through the cache\n%s\nwant\n%s", seed, i, got, want)
			}
		}
		if hits < 60 {
			t.Errorf("seed %d: %d of 200 requests began with the cached prefix, want most", seed, hits)
		}
	}
}

// EmptyEqualsWhole compares the body of a request without messages, with
// and without a system prompt, built through a cache with the whole
// request marshalled at once.
func EmptyEqualsWhole(t *testing.T, w Wire, maxTokens int) {
	t.Helper()
	for _, sys := range []string{"", w.System} {
		req := &model.Request{SessionID: "s", Model: w.Model, SystemPrompt: sys}
		got, err := w.Build(req, maxTokens, wirecache.New(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		if want := w.Whole(t, req, maxTokens); !bytes.Equal(got, want) {
			t.Errorf("system %q: body %s, want %s", sys, got, want)
		}
	}
}

// BuildLong builds a late request of a long Session (the long
// benchmark's Tasks: a prompt and a short answer each) with and without
// the Session's cached prefix: copied bytes against the whole context
// converted and marshalled.
func BuildLong(b *testing.B, w Wire) {
	for _, tasks := range []int{10, 2000} {
		var ctx []*omni.Message
		for i := range tasks {
			ctx = append(ctx, new(omni.UserText(fmt.Sprintf("step %d: what is in this folder?", i))),
				new(omni.Text(omni.RoleAssistant, "The folder holds a README, a go.mod and the cmd, pkg and services directories.")))
		}
		for _, cached := range []bool{false, true} {
			b.Run(fmt.Sprintf("tasks=%d/cached=%v", tasks, cached), func(b *testing.B) {
				var cache *wirecache.Cache
				if cached {
					cache = wirecache.New(0, 0)
				}
				next := new(omni.UserText("one more"))
				req := &model.Request{SessionID: "s", Model: w.Model, SystemPrompt: w.System, Messages: append(ctx[:len(ctx):len(ctx)], next)}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := w.Build(req, 1000, cache); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
