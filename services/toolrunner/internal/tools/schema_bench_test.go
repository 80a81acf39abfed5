package tools

import "testing"

// BenchmarkCheckArguments measures validating one exec_command call's
// arguments against its compiled schema: a valid call and one with three
// problems.
func BenchmarkCheckArguments(b *testing.B) {
	r := Builtin(Options{})
	e := r.tools[r.byName["exec_command"]]
	for _, bc := range []struct{ name, args string }{
		{"valid", `{"description": "list", "cmd": "ls -la", "workdir": "sub", "timeout_ms": 5000}`},
		{"invalid", `{"cmd": 42, "timeout_ms": 1.5, "shell": "zsh"}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _, _ = e.args.Check(bc.args)
			}
		})
	}
}
