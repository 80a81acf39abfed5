// Package toolenv builds the environment of every process a tool starts:
// exec_command's bash and MCP stdio servers. It is an allow-list, never the
// toolrunner's own environment, so Floe's secrets (FLOE_API_TOKEN, provider
// API keys, NATS passwords and credentials paths) stay out of tools.
package toolenv

import (
	"os"
	"strings"
)

// Allowed are the variables passed through from the toolrunner's environment
// to every tool process, when set.
var Allowed = []string{"PATH", "HOME", "LANG", "TERM", "USER", "SHELL", "TMPDIR"}

// ExtraVar names the variable that lists, comma- or space-separated, further
// variables of the toolrunner's environment to pass to tools (for example
// "GOPATH,LC_ALL"). A name may end in "*" to pass every variable with that
// prefix ("LC_*").
const ExtraVar = "FLOE_TOOL_ENV"

// Environ returns the environment for a tool process: the allowed variables
// of the toolrunner's process environment, then extra ("KEY=value" entries
// such as FLOE_SESSION_ID=… and FLOE_TOOL_CALL_ID=…, or an MCP server's
// declared env), which win over them. Use it as exec.Cmd.Env; never leave
// Cmd.Env nil, which would inherit everything.
func Environ(extra ...string) []string {
	return From(os.Environ(), extra...)
}

// From is Environ with base as the toolrunner's environment, whose
// FLOE_TOOL_ENV (if any) names the extras to pass.
func From(base []string, extra ...string) []string {
	names := map[string]bool{}
	for _, n := range Allowed {
		names[n] = true
	}
	var prefixes []string
	for _, kv := range base {
		if v, ok := strings.CutPrefix(kv, ExtraVar+"="); ok {
			for _, n := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == ':' }) {
				if p, ok := strings.CutSuffix(n, "*"); ok {
					if p != "" { // a bare "*" would pass everything
						prefixes = append(prefixes, p)
					}
					continue
				}
				names[n] = true
			}
		}
	}
	env := make([]string, 0, len(Allowed)+len(extra)+4)
	for _, kv := range base {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if names[k] || hasAnyPrefix(k, prefixes) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

func hasAnyPrefix(k string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}
