package providertest

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"testing/iotest"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// Decoder is a provider's stream decoder.
type Decoder func(body io.Reader, ids *model.IDAllocator, emit func(model.Delta) error) (model.Result, error)

// SeedCorpus adds every recorded stream in testdata/*.sse to f.
func SeedCorpus(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.sse")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// CheckDecode is the body of a provider's FuzzDecode: decoding body must
// not panic, must honour the Delta contract, must fail only with a stream
// status, and must give the same outcome whether the body arrives whole or
// one byte at a time.
func CheckDecode(t *testing.T, decode Decoder, body []byte) {
	if len(body) > 1<<20 {
		t.Skip()
	}
	whole, wres, werr := run(decode, bytes.NewReader(body))
	if err := CheckDeltas(whole, werr == nil); err != nil {
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
	bytewise, bres, berr := run(decode, iotest.OneByteReader(bytes.NewReader(body)))
	if !reflect.DeepEqual(whole, bytewise) || wres != bres || !reflect.DeepEqual(werr, berr) {
		t.Fatalf("decoding depends on read boundaries:\nwhole: %+v %v\nbytes: %+v %v", whole, werr, bytewise, berr)
	}
}

func run(decode Decoder, r io.Reader) ([]model.Delta, model.Result, error) {
	var ds []model.Delta
	res, err := decode(r, &model.IDAllocator{}, func(d model.Delta) error {
		ds = append(ds, d)
		return nil
	})
	return ds, res, err
}
