package openai

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"testing/iotest"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// FuzzDecode feeds arbitrary bytes as the SSE body through the real decoder.
// It must never panic, must honour the Delta contract, must fail only with
// a stream status, and must decode the same whether the body arrives whole
// or one byte at a time.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.sse")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("data: " + chunkJSON(`{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}`) + "\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\",\"code\":503}}\n\n"))
	f.Add([]byte(": c\r\ndata: {}\r\n\r\ndata: [DONE]"))
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > 1<<20 {
			t.Skip()
		}
		whole, wres, werr := fuzzDecode(bytes.NewReader(body))
		if err := checkDeltas(whole, werr == nil); err != nil {
			t.Fatalf("%v\ndeltas: %+v", err, whole)
		}
		if werr != nil {
			var me *model.Error
			if !errors.As(werr, &me) {
				t.Fatalf("error %v is not a *model.Error", werr)
			}
			switch me.Status {
			case omni.StatusMalformed, omni.StatusTimeout, omni.StatusFailed, omni.StatusAuth:
			default:
				t.Fatalf("error status %q", me.Status)
			}
		} else if wres.StopReason == "" {
			t.Fatal("success without stop reason")
		}
		bytewise, bres, berr := fuzzDecode(iotest.OneByteReader(bytes.NewReader(body)))
		if !reflect.DeepEqual(whole, bytewise) || wres != bres || !reflect.DeepEqual(werr, berr) {
			t.Fatalf("decoding depends on read boundaries:\nwhole: %+v %v\nbytes: %+v %v", whole, werr, bytewise, berr)
		}
	})
}

func fuzzDecode(r interface{ Read([]byte) (int, error) }) ([]model.Delta, model.Result, error) {
	var ds []model.Delta
	res, err := decode(r, &model.IDAllocator{}, func(d model.Delta) error {
		ds = append(ds, d)
		return nil
	})
	return ds, res, err
}
