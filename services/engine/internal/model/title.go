package model

import (
	"strings"
	"unicode/utf8"
)

// TitleExcerptMax caps each side of the conversation a title request
// quotes, in bytes (cut at a rune boundary): the request stays cheap.
const TitleExcerptMax = 2000

// TitleInstruction starts every title request's text: a fake model server
// in a test tells the request from the agent loop's by it.
const TitleInstruction = "Write a short title for the conversation below."

// Markers of the title prompt's parts; TitleMaterial finds them again.
const (
	titleUserMark      = "[User]\n"
	titleAssistantMark = "\n\n[Assistant]\n"
	titleEndMark       = "\n\n<think></think>"
)

// TitlePrompt is the user text of a title request: a short instruction
// (in English, asking for the conversation's own language), then the first
// Task's user text and the model's answer, each cut at TitleExcerptMax. The
// trailing empty think block makes reasoning models skip their thinking.
// The original harness asks the same way (a one-off request on the
// Session's model, no tools, no system prompt, thinking off).
func TitlePrompt(user, assistant string) string {
	var b strings.Builder
	b.WriteString(TitleInstruction + "\n" +
		"Rules:\n" +
		"- Use the same language as the user.\n" +
		"- At most 6 words (about 16 characters for Chinese, Japanese or Korean).\n" +
		"- Output only the title: no quotes, no final punctuation, no explanation.\n" +
		"- Answer at once, without thinking aloud.\n\n")
	b.WriteString(titleUserMark)
	b.WriteString(clip(user))
	if strings.TrimSpace(assistant) != "" {
		b.WriteString(titleAssistantMark)
		b.WriteString(clip(assistant))
	}
	b.WriteString(titleEndMark)
	return b.String()
}

// TitleMaterial returns the user text a title request (PurposeTitle, made
// with TitlePrompt) quotes; "" when req is not such a request.
func TitleMaterial(req *Request) string {
	if req.Purpose != PurposeTitle || len(req.Messages) == 0 {
		return ""
	}
	text := req.Messages[len(req.Messages)-1].Payload.Text
	_, rest, ok := strings.Cut(text, titleUserMark)
	if !ok {
		return ""
	}
	if i := strings.Index(rest, titleAssistantMark); i >= 0 {
		return rest[:i]
	}
	return strings.TrimSuffix(rest, titleEndMark)
}

func clip(s string) string {
	if len(s) <= TitleExcerptMax {
		return s
	}
	s = s[:TitleExcerptMax]
	for len(s) > 0 {
		if r, n := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || n > 1 {
			break
		}
		s = s[:len(s)-1] // part of the rune the cut split
	}
	return s
}
