package trace

import (
	"bytes"
	"os"
	"testing"

	"floe.dev/pkg/omni"
)

// FuzzClose feeds any Trace (its valid records, as a cut would carry
// them) to Close: no panic; an error only without a session_meta; the
// carried records are the input's after the last head; the closing
// records are valid and, folded after them, leave nothing open.
func FuzzClose(f *testing.F) {
	golden, err := os.ReadFile(goldenPath)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(golden, uint16(0))
	f.Add(golden, uint16(len(golden)/2))
	f.Add([]byte(v0213Seed), uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		if cut > 0 && int(cut) < len(data) {
			data = data[:cut]
		}
		msgs, _, _ := Read(bytes.NewReader(data))
		recs := make([]Record, len(msgs))
		head := -1
		for i := range msgs {
			recs[i] = Record{Data: omni.MustMarshal(&msgs[i])}
			if msgs[i].Type == omni.KindSessionMeta && len(msgs[i].Origin) == 0 {
				head = i
			}
		}
		c, err := Close(recs, 7)
		if head < 0 {
			if err == nil {
				t.Fatal("Close without a session_meta: no error")
			}
			return
		}
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
		if len(c.Records) != len(recs)-head-1 {
			t.Fatalf("Close carries %d records, want the %d after the last head", len(c.Records), len(recs)-head-1)
		}
		var st openState
		for i, b := range c.Records {
			var m omni.Message
			if decode(b, &m) == nil {
				st.apply(i, &m)
			}
		}
		for i := range c.Close {
			if err := c.Close[i].Validate(); err != nil {
				t.Fatalf("closing record %d invalid: %v", i, err)
			}
			st.apply(len(c.Records)+i, &c.Close[i])
		}
		if st.request || st.compacting || len(st.calls) > 0 {
			t.Fatalf("after the closing records something is still open: %+v", st)
		}
	})
}
