package toolenv

import (
	"slices"
	"testing"
)

func TestFromKeepsOnlyAllowedAndNamedExtras(t *testing.T) {
	base := []string{
		"PATH=/usr/bin", "HOME=/home/u", "LANG=C.UTF-8", "TERM=xterm", "USER=u", "SHELL=/bin/bash", "TMPDIR=/tmp",
		"FLOE_API_TOKEN=secret-token", "OPENAI_API_KEY=sk-1", "ANTHROPIC_API_KEY=sk-2",
		"FLOE_NATS_PASSWORD=pw", "FLOE_NATS_CREDS=/x/creds", "NATS_URL=nats://u:pw@h",
		"GOPATH=/go", "LC_ALL=C", "LC_CTYPE=C", "FLOE_TOOL_ENV=GOPATH, LC_*,*",
		"NOEQUALS", "=weird",
	}
	got := From(base, "FLOE_SESSION_ID=s1", "FLOE_TOOL_CALL_ID=t1")
	want := []string{
		"PATH=/usr/bin", "HOME=/home/u", "LANG=C.UTF-8", "TERM=xterm", "USER=u", "SHELL=/bin/bash", "TMPDIR=/tmp",
		"GOPATH=/go", "LC_ALL=C", "LC_CTYPE=C",
		"FLOE_SESSION_ID=s1", "FLOE_TOOL_CALL_ID=t1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("From() =\n%q\nwant\n%q", got, want)
	}
}

func TestFromWithoutExtrasVariable(t *testing.T) {
	got := From([]string{"PATH=/bin", "AWS_SECRET_ACCESS_KEY=x", "GOPATH=/go"})
	if !slices.Equal(got, []string{"PATH=/bin"}) {
		t.Errorf("From() = %q, want only PATH", got)
	}
}
