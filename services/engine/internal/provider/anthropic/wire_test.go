package anthropic

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

// marshalWhole is the request body as json.Marshal gives it of the whole
// messagesRequest: what buildRequest returns, with or without a cache.
func marshalWhole(t testing.TB, req *model.Request, maxTokens int) []byte {
	t.Helper()
	mr := messagesRequest{Model: req.Model, MaxTokens: maxTokens, Stream: true}
	if req.SystemPrompt != "" {
		mr.System = []*textBlock{{Type: "text", Text: req.SystemPrompt, CacheControl: ephemeral}}
	}
	if budget, ok := thinkingBudgets[req.ThinkingLevel]; ok {
		mr.Thinking = &thinking{Type: "enabled", BudgetTokens: budget}
		mr.MaxTokens += budget
	}
	for _, tl := range req.Tools {
		schema := tl.Parameters
		if len(schema) == 0 || string(schema) == "null" {
			schema = emptySchema
		}
		mr.Tools = append(mr.Tools, tool{Name: tl.Name, Description: tl.Description, InputSchema: schema})
	}
	mr.Messages, _, _ = groups(req.Messages, nil)
	if n := len(mr.Messages); n > 0 {
		c := mr.Messages[n-1].Content
		switch b := c[len(c)-1].(type) {
		case *textBlock:
			b.CacheControl = ephemeral
		case *mediaBlock:
			b.CacheControl = ephemeral
		case *toolUseBlock:
			b.CacheControl = ephemeral
		case *toolResultBlock:
			b.CacheControl = ephemeral
		}
	}
	body, err := json.Marshal(mr)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// randomMessage is any model message the context may hold, including
// ones that send nothing (empty text, thinking of another provider).
func randomMessage(r *rand.Rand, i int) *omni.Message {
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
		m.Payload.Fidelity = json.RawMessage(`{"signature":"s"}`)
	case 6:
		m = omni.Thinking("foreign")
		m.Payload.Fidelity = json.RawMessage(`{"reasoning_field":"reasoning"}`)
	case 7:
		m = omni.ToolCall("read_file", fmt.Sprintf(`{"path":"%d.go"}`, i), fmt.Sprintf("toolu_%d", i))
	case 8:
		m = omni.ToolCallOutput(fmt.Sprintf("toolu_%d", i), fmt.Sprintf("output %d", i), "")
	case 9:
		m = omni.ToolCallOutput(fmt.Sprintf("call|%d", i), "exit status 1", omni.StatusFailed)
		m.Payload.Images = json.RawMessage(`["data:image/png;base64,AAAA"]`)
	case 10:
		m = omni.Model(omni.Payload{Type: omni.TypeImageURL, Role: omni.RoleUser, ImageURL: "https://example.com/a.png"})
	case 11:
		m = omni.Model(omni.Payload{Type: omni.TypeInlineData, Role: omni.RoleUser, MimeType: "application/pdf", Data: "JVBERi0="})
	}
	return &m
}

// TestBuildRequestWithCacheEqualsWhole replays Sessions whose context
// grows request by request (and sometimes gets a fresh copy of a message,
// an extra text at its end, a title request, or a compaction that starts
// it over) and compares every body built through the cache with the
// whole request marshalled at once.
func TestBuildRequestWithCacheEqualsWhole(t *testing.T) {
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 27))
		cache := wirecache.New(0, 0)
		var ctx []*omni.Message
		hits := 0
		for i := range 200 {
			for range 1 + r.IntN(4) {
				ctx = append(ctx, randomMessage(r, i))
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
			req := &model.Request{SessionID: fmt.Sprint("s", seed%3), Model: "claude", SystemPrompt: "Be brief.", Messages: msgs,
				Tools: []omni.ToolSpec{{Name: "read_file"}}}
			if r.IntN(15) == 0 {
				req.Purpose = model.PurposeTitle
			}
			if r.IntN(4) == 0 {
				req.ThinkingLevel = "low"
			}
			if cache.Lookup(req.SessionID, msgs) != nil {
				hits++
			}
			got, err := buildRequest(req, 1000, cache)
			if err != nil {
				t.Fatal(err)
			}
			if want := marshalWhole(t, req, 1000); !bytes.Equal(got, want) {
				t.Fatalf("seed %d request %d: body through the cache\n%s\nwant\n%s", seed, i, got, want)
			}
		}
		if hits < 60 {
			t.Errorf("seed %d: %d of 200 requests began with the cached prefix, want most", seed, hits)
		}
	}
}

func TestBuildRequestWithoutMessages(t *testing.T) {
	req := &model.Request{SessionID: "s", Model: "claude"}
	got, err := buildRequest(req, 10, wirecache.New(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if want := marshalWhole(t, req, 10); !bytes.Equal(got, want) {
		t.Errorf("buildRequest = %s, want %s", got, want)
	}
}

// BenchmarkBuildRequestLong builds a late request of a long Session (the
// long benchmark's Tasks: a prompt and a short answer each) with and
// without the Session's cached prefix: copied bytes against the whole
// context converted and marshalled.
func BenchmarkBuildRequestLong(b *testing.B) {
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
				req := &model.Request{SessionID: "s", Model: "claude", Messages: append(ctx[:len(ctx):len(ctx)], next)}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := buildRequest(req, 1000, cache); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
