package scripted

import (
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

func titleReq(sid, user string) *model.Request {
	r := newReq(sid, omni.UserText(model.TitlePrompt(user, "an answer")))
	r.Purpose = model.PurposeTitle
	return r
}

// A title request is answered from the script's "title" field, is not
// counted, and leaves the script where it was.
func TestTitleRequestDoesNotConsumeTheScript(t *testing.T) {
	p := mustParse(t, `{"title": "Fix the build", "requests": [{"steps": [{"text": "first"}]}]}`)
	ds, res, err := run(t, p, titleReq("s", "please fix the build"))
	if err != nil || res.StopReason != omni.StatusCompleted || joinBlocks(ds)[0] != "Fix the build" {
		t.Fatalf("title: %v %+v %s", err, res, fmtDeltas(ds))
	}
	checkDiscipline(t, ds)
	if n := p.Calls("s"); n != 0 {
		t.Fatalf("Calls = %d after a title request", n)
	}
	ds, _, err = run(t, p, newReq("s", omni.UserText("go")))
	if err != nil || joinBlocks(ds)[0] != "first" {
		t.Fatalf("first request after the title: %v %s", err, fmtDeltas(ds))
	}
}

// A script without a title fails the request (the Session keeps its
// title), still without counting it.
func TestTitleRequestWithoutTitleFails(t *testing.T) {
	p := mustParse(t, `{"requests": [{"steps": [{"text": "first"}]}]}`)
	ds, _, err := run(t, p, titleReq("s", "hi"))
	if statusOf(err) != omni.StatusFailed || len(ds) != 0 || p.Calls("s") != 0 {
		t.Fatalf("%v, %d deltas, %d calls", err, len(ds), p.Calls("s"))
	}
}

func TestDemoTitle(t *testing.T) {
	p := Demo()
	for _, c := range []struct{ user, want string }{
		{"what is in this folder?", "What is in this folder"},
		{"\n  explain   the main function of server.go to me please\nmore", "Explain the main function of"},
		{"ünïcode first.", "Ünïcode first"},
	} {
		ds, _, err := run(t, p, titleReq("d", c.user))
		if err != nil || joinBlocks(ds)[0] != c.want {
			t.Errorf("demo title of %q: %v %q, want %q", c.user, err, joinBlocks(ds)[0], c.want)
		}
	}
	if _, _, err := run(t, p, titleReq("d", " \n ")); statusOf(err) != omni.StatusFailed {
		t.Errorf("demo title of a blank text: %v, want failed", err)
	}
	if n := p.Calls("d"); n != 0 {
		t.Fatalf("Calls = %d", n)
	}
}
