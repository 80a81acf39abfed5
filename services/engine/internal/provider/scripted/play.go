package scripted

import (
	"context"
	"time"
	"unicode/utf8"

	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// defaultFragment is the length, in code points, of a delta when a step
// does not say how many chunks it wants.
const defaultFragment = 16

// player streams the steps of one request.
type player struct {
	emit     func(model.Delta) error
	ids      *model.IDAllocator
	block    int   // next block index
	outChars int64 // code points of content emitted
}

func (pl *player) play(ctx context.Context, steps []step) error {
	for i := range steps {
		if err := pl.step(ctx, &steps[i]); err != nil {
			return err
		}
	}
	return nil
}

func (pl *player) step(ctx context.Context, st *step) error {
	switch st.kind {
	case stepDelay:
		return retry.Sleep(ctx, st.delay)
	case stepError:
		if err := retry.Sleep(ctx, st.delay); err != nil {
			return err
		}
		return &model.Error{Status: st.err.status, Message: st.err.message, HTTPStatus: st.err.httpStatus}
	case stepThinking, stepText:
		typ := omni.TypeText
		if st.kind == stepThinking {
			typ = omni.TypeThinking
		}
		b := pl.block
		pl.block++
		pieces := split(st.content, st.chunks)
		for i, piece := range pieces {
			d := model.Delta{Block: b, Type: typ, Text: piece}
			if i == len(pieces)-1 {
				d.End = !st.open
				d.Fidelity = st.fidelity
			}
			if err := pl.send(ctx, st.delay, d); err != nil {
				return err
			}
		}
		return nil
	case stepToolCall:
		return pl.calls(ctx, st.calls, false, st.open)
	case stepParallel:
		return pl.calls(ctx, st.calls, st.interleave, st.open)
	}
	return nil
}

// calls streams tool calls, one block each, either one after another or
// interleaved round-robin with every block ended at the end.
func (pl *player) calls(ctx context.Context, calls []call, interleave, open bool) error {
	type stream struct {
		c      *call
		block  int
		id     string
		pieces []string
	}
	streams := make([]stream, len(calls))
	for i := range calls {
		c := &calls[i]
		streams[i] = stream{c: c, block: pl.block, id: pl.ids.Assign(c.id), pieces: split(c.args, c.chunks)}
		pl.block++
	}
	fragment := func(s *stream, i int) model.Delta {
		d := model.Delta{Block: s.block, Type: omni.TypeToolCall, Text: s.pieces[i]}
		if i == 0 {
			d.Name, d.ToolCallID = s.c.name, s.id
		}
		return d
	}
	if !interleave {
		for si := range streams {
			s := &streams[si]
			for i := range s.pieces {
				d := fragment(s, i)
				if i == len(s.pieces)-1 {
					d.End = !open
					d.Fidelity = s.c.fidelity
				}
				if err := pl.send(ctx, s.c.delay, d); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for round := 0; ; round++ {
		sent := false
		for si := range streams {
			s := &streams[si]
			if round >= len(s.pieces) {
				continue
			}
			d := fragment(s, round)
			if open && round == len(s.pieces)-1 {
				d.Fidelity = s.c.fidelity
			}
			if err := pl.send(ctx, s.c.delay, d); err != nil {
				return err
			}
			sent = true
		}
		if !sent {
			break
		}
	}
	if open {
		return nil
	}
	for si := range streams {
		s := &streams[si]
		if err := pl.send(ctx, 0, model.Delta{Block: s.block, Type: omni.TypeToolCall, End: true, Fidelity: s.c.fidelity}); err != nil {
			return err
		}
	}
	return nil
}

// send waits delay, then emits d unless ctx has ended.
func (pl *player) send(ctx context.Context, delay time.Duration, d model.Delta) error {
	if err := retry.Sleep(ctx, delay); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	pl.outChars += int64(utf8.RuneCountInString(d.Text))
	return pl.emit(d)
}

// split cuts s into n pieces of near-equal length in code points (fewer when
// s has fewer code points, one when s is empty), or into pieces of
// defaultFragment code points when n is 0. The pieces concatenate to s; a
// UTF-8 sequence is never cut (invalid bytes count as one code point each).
func split(s string, n int) []string {
	runes := utf8.RuneCountInString(s)
	if runes == 0 {
		return []string{s}
	}
	var sizes []int // code points per piece
	if n <= 0 {
		for left := runes; left > 0; left -= defaultFragment {
			sizes = append(sizes, min(left, defaultFragment))
		}
	} else {
		n = min(n, runes)
		for i := range n {
			size := runes / n
			if i < runes%n {
				size++
			}
			sizes = append(sizes, size)
		}
	}
	pieces := make([]string, 0, len(sizes))
	for _, size := range sizes {
		end := 0
		for range size {
			_, w := utf8.DecodeRuneInString(s[end:])
			end += w
		}
		pieces = append(pieces, s[:end])
		s = s[end:]
	}
	return pieces
}

// estimate is the default usage of a request that streamed outChars code
// points: output = ceil(outChars/4), total = ceil(context chars/4) + output.
// It reads every message of the request, as a real model's tokenizer
// does: its CPU is the model's, not Floe's, and is counted in ModelCPU.
func estimate(req *model.Request, outChars int64) omni.Usage {
	defer countCPU()()
	return count(req, outChars)
}

func count(req *model.Request, outChars int64) omni.Usage {
	ctxChars := int64(utf8.RuneCountInString(req.SystemPrompt))
	for i := range req.Messages {
		pl := &req.Messages[i].Payload
		for _, s := range []string{pl.Text, pl.Thinking, pl.Name, pl.Arguments, pl.Output, pl.ImageURL, pl.Data} {
			ctxChars += int64(utf8.RuneCountInString(s))
		}
	}
	for _, t := range req.Tools {
		ctxChars += int64(utf8.RuneCountInString(t.Name) + utf8.RuneCountInString(t.Description) + utf8.RuneCount(t.Parameters))
	}
	out := ceilDiv4(outChars)
	return omni.Usage{Output: out, Total: ceilDiv4(ctxChars) + out}
}

func ceilDiv4(n int64) int64 { return (n + 3) / 4 }
