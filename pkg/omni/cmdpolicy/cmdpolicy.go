// Package cmdpolicy is the command policy of protocol.md §7: an ordered list of
// RE2 deny rules matched against the normalized cmd of exec_command before
// any approval mode is consulted. A hit is decided "forbidden" and nothing
// runs. It is an accident guardrail against the commands people and models
// type by mistake, not a sandbox: nothing is expanded or decoded, so a
// determined caller can always spell a command so that no rule sees it.
//
// Normalization (see Candidates) collapses whitespace and rewrites the
// command word of every simple command the way it is typically typed: a
// leading path (/bin/rm), the wrappers sudo, env, command, nice and xargs
// (and exec, nohup, time), quotes or a backslash on the word, and the
// literal payload of sh -c '…' / bash -c '…'. Rules see the whole
// normalized command and each simple command on its own, so a rule
// anchored with ^ matches a command word, and `echo rm -rf` stays legal.
package cmdpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"floe.dev/pkg/omni"
)

// Sources of a policy other than a rules file.
const (
	SourceFactory = "factory"
	SourceOff     = "off"
)

// Factory returns the factory rule set, on by default: rm with both a
// recursive and a force flag, mkfs, dd onto a block device, the classic
// fork bomb and redirection onto a block device (/dev/null stays legal).
func Factory() *omni.CommandPolicy {
	const blockDev = `/dev/(sd[a-z]|hd[a-z]|vd[a-z]|xvd[a-z]|nvme[0-9]|mmcblk[0-9]|disk[0-9]|rdisk[0-9]|loop[0-9]|md[0-9]|dm-[0-9]|sr[0-9]|mapper/)`
	const (
		rf = `-[A-Za-z]*([rR][A-Za-z]*f|f[A-Za-z]*[rR])[A-Za-z]*`
		r  = `(-[A-Za-z]*[rR][A-Za-z]*|--recursive)`
		f  = `(-[A-Za-z]*f[A-Za-z]*|--force)`
		fn = `[A-Za-z_:][A-Za-z0-9_:]*`
	)
	return &omni.CommandPolicy{Source: SourceFactory, Rules: []omni.CommandRule{
		{Name: "rm-recursive-force", Pattern: `^rm(\s+\S+)*?\s+(` + rf + `|` + r + `(\s+\S+)*\s+` + f + `|` + f + `(\s+\S+)*\s+` + r + `)(\s|$)`,
			Description: "rm with both a recursive and a force flag"},
		{Name: "mkfs", Pattern: `^mkfs(\.[A-Za-z0-9]+)?(\s|$)`, Description: "creating a file system"},
		{Name: "dd-block-device", Pattern: `^dd(\s+\S+)*\s+of=` + blockDev, Description: "dd onto a block device"},
		{Name: "fork-bomb", Pattern: fn + `\s*\(\)\s*\{\s*` + fn + `\s*\|\s*` + fn + `\s*&\s*\}`, Description: "the classic fork bomb"},
		{Name: "redirect-block-device", Pattern: `>\s*` + blockDev, Description: "redirecting output onto a block device"},
	}}
}

// Off is the policy of a deployment that turned the command policy off.
func Off() *omni.CommandPolicy {
	return &omni.CommandPolicy{Source: SourceOff, Rules: []omni.CommandRule{}}
}

// Load resolves a FLOE_COMMAND_POLICY value: "" is the factory set, "off"
// no rules, anything else the path of a JSON file
// {"rules": [{"name", "pattern", "description"?, "enabled"?}]} whose rules
// replace the factory set. Every pattern must compile.
func Load(spec string) (*omni.CommandPolicy, error) {
	switch strings.TrimSpace(spec) {
	case "":
		return Factory(), nil
	case SourceOff:
		return Off(), nil
	}
	b, err := os.ReadFile(spec)
	if err != nil {
		return nil, fmt.Errorf("command policy: %w", err)
	}
	p, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("command policy %s: %w", spec, err)
	}
	p.Source = spec
	return p, nil
}

// Parse decodes and checks a rules file.
func Parse(b []byte) (*omni.CommandPolicy, error) {
	var f struct {
		Rules *[]omni.CommandRule `json:"rules"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("decode rules file: %w", err)
	}
	if f.Rules == nil {
		return nil, errors.New(`rules file has no "rules" list`)
	}
	p := &omni.CommandPolicy{Rules: *f.Rules}
	if p.Rules == nil {
		p.Rules = []omni.CommandRule{}
	}
	if _, err := Compile(p); err != nil {
		return nil, err
	}
	return p, nil
}

// Matcher is a compiled policy; safe for concurrent use.
type Matcher struct {
	rules []compiled
}

type compiled struct {
	rule omni.CommandRule
	re   *regexp.Regexp
}

// Compile compiles p's enabled rules. A nil p is the factory set (records
// that predate the policy).
func Compile(p *omni.CommandPolicy) (*Matcher, error) {
	if p == nil {
		p = Factory()
	}
	m := &Matcher{}
	seen := map[string]bool{}
	for i, r := range p.Rules {
		if r.Name == "" {
			return nil, fmt.Errorf("rule %d has no name", i+1)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("rule %q is listed twice", r.Name)
		}
		seen[r.Name] = true
		if r.Pattern == "" {
			return nil, fmt.Errorf("rule %q has no pattern", r.Name)
		}
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", r.Name, err)
		}
		if r.Enabled != nil && !*r.Enabled {
			continue
		}
		m.rules = append(m.rules, compiled{rule: r, re: re})
	}
	return m, nil
}

// Match returns the first enabled rule (in policy order) that matches cmd
// or one of its normalized simple commands.
func (m *Matcher) Match(cmd string) (omni.CommandRule, bool) {
	if m == nil || len(m.rules) == 0 {
		return omni.CommandRule{}, false
	}
	cands := Candidates(cmd)
	for _, c := range m.rules {
		for _, s := range cands {
			if c.re.MatchString(s) {
				return c.rule, true
			}
		}
	}
	return omni.CommandRule{}, false
}

// maxDepth bounds how many nested sh -c payloads are unwrapped.
const maxDepth = 4

// Candidates returns the strings rules are matched against: cmd with its
// whitespace collapsed, then every simple command of it with its command
// word normalized, then (recursively) those of each sh -c / bash -c
// payload.
func Candidates(cmd string) []string {
	var out []string
	collect(cmd, 0, &out)
	return out
}

func collect(cmd string, depth int, out *[]string) {
	*out = append(*out, strings.Join(strings.Fields(cmd), " "))
	for _, seg := range split(cmd) {
		words, payload := normalize(seg)
		if len(words) > 0 {
			*out = append(*out, strings.Join(words, " "))
		}
		if payload != "" && depth < maxDepth {
			collect(payload, depth+1, out)
		}
	}
}

// token is one shell word: raw as typed, value with quotes and backslashes
// removed (nothing expanded).
type token struct{ raw, value string }

// split cuts cmd into simple commands at unquoted ; & | ( ) ` and
// newlines, and each into words.
func split(cmd string) [][]token {
	var segs [][]token
	var cur []token
	var raw, val strings.Builder
	inWord := false
	endWord := func() {
		if inWord {
			cur = append(cur, token{raw: raw.String(), value: val.String()})
			raw.Reset()
			val.Reset()
			inWord = false
		}
	}
	endSeg := func() {
		endWord()
		if len(cur) > 0 {
			segs = append(segs, cur)
			cur = nil
		}
	}
	for i := 0; i < len(cmd); i++ {
		c := cmd[i]
		switch {
		case c == '\'':
			inWord = true
			j := strings.IndexByte(cmd[i+1:], '\'')
			if j < 0 {
				j = len(cmd) - i - 1
			}
			raw.WriteString(cmd[i:min(len(cmd), i+j+2)])
			val.WriteString(cmd[i+1 : i+1+j])
			i += j + 1
		case c == '"':
			inWord = true
			raw.WriteByte(c)
			for i++; i < len(cmd) && cmd[i] != '"'; i++ {
				raw.WriteByte(cmd[i])
				if cmd[i] == '\\' && i+1 < len(cmd) {
					i++
					raw.WriteByte(cmd[i])
				}
				val.WriteByte(cmd[i])
			}
			if i < len(cmd) {
				raw.WriteByte('"')
			}
		case c == '\\':
			inWord = true
			raw.WriteByte(c)
			if i+1 < len(cmd) {
				i++
				if cmd[i] == '\n' { // line continuation: neither character counts
					r := raw.String()
					raw.Reset()
					raw.WriteString(r[:len(r)-1])
					continue
				}
				raw.WriteByte(cmd[i])
				val.WriteByte(cmd[i])
			}
		case c == ' ' || c == '\t' || c == '\r':
			endWord()
		case c == '\n' || c == ';' || c == '&' || c == '|' || c == '(' || c == ')' || c == '`':
			endSeg()
		case c == '$' && i+1 < len(cmd) && cmd[i+1] == '(':
			endSeg()
		default:
			inWord = true
			raw.WriteByte(c)
			val.WriteByte(c)
		}
	}
	endSeg()
	return segs
}

// wrappers run the rest of their words as a command; the value is the set
// of their options that take a separate argument.
var wrappers = map[string]map[string]bool{
	"sudo":    set("-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "--user", "--group"),
	"env":     set("-u", "-C", "-S", "--unset", "--chdir"),
	"command": set(),
	"nice":    set("-n", "--adjustment"),
	"xargs":   set("-I", "-n", "-P", "-d", "-L", "-s", "-E", "-a", "--max-args", "--max-procs", "--delimiter", "--arg-file"),
	"exec":    set("-a"),
	"nohup":   set(),
	"time":    set("-f", "-o"),
	// Shell keywords that start a simple command.
	"!": set(), "{": set(), "then": set(), "do": set(), "else": set(), "if": set(), "while": set(), "until": set(),
}

func set(s ...string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, v := range s {
		m[v] = true
	}
	return m
}

var shells = set("sh", "bash", "dash", "zsh", "ksh")

// normalize returns a simple command's words starting at its real command
// word (wrappers dropped, the word unquoted and without its path), and the
// payload when it is a shell run with -c.
func normalize(seg []token) (words []string, payload string) {
	i := 0
	for i < len(seg) {
		w := word(seg[i].value)
		opts, ok := wrappers[w]
		if !ok {
			break
		}
		i++
		for i < len(seg) {
			v := seg[i].value
			switch {
			case v == "--":
				i++
			case w == "env" && strings.Contains(v, "=") && !strings.HasPrefix(v, "-"):
				i++
				continue
			case w == "nice" && len(v) > 1 && v[0] == '-' && isDigits(v[1:]):
				i++
				continue
			case strings.HasPrefix(v, "-") && len(v) > 1:
				i++
				if opts[v] {
					i++
				}
				continue
			}
			break
		}
	}
	if i >= len(seg) {
		return nil, ""
	}
	w := word(seg[i].value)
	words = append(words, w)
	for _, t := range seg[i+1:] {
		words = append(words, t.raw)
	}
	if shells[w] {
		for j := i + 1; j < len(seg); j++ {
			v := seg[j].value
			if !strings.HasPrefix(v, "-") || v == "-" || v == "--" {
				break
			}
			if !strings.HasPrefix(v, "--") && strings.Contains(v, "c") {
				if j+1 < len(seg) {
					payload = seg[j+1].value
				}
				break
			}
		}
	}
	return words, payload
}

// word is a command word without its leading path.
func word(v string) string {
	if k := strings.LastIndexByte(v, '/'); k >= 0 && k < len(v)-1 {
		return v[k+1:]
	}
	return v
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
