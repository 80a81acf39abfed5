package server

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

func (s *Server) handleTraces(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	files, err := trace.Files(s.opts.Home, rec.ID)
	if err != nil {
		return internalError("list trace files", err)
	}
	out := client.TraceList{Traces: []client.TraceFile{}}
	for _, f := range files {
		idx, ok := trace.IndexOf(f, rec.ID)
		if !ok {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			continue
		}
		out.Traces = append(out.Traces, client.TraceFile{Index: idx, Name: filepath.Base(f), Size: fi.Size()})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handleTrace(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	idx, err := strconv.Atoi(r.PathValue("index"))
	if err != nil || idx <= 0 {
		return errorf(http.StatusNotFound, omni.CodeNotFound, "trace %q not found", r.PathValue("index"))
	}
	files, err := trace.Files(s.opts.Home, rec.ID)
	if err != nil {
		return internalError("list trace files", err)
	}
	for _, path := range files {
		if i, ok := trace.IndexOf(path, rec.ID); !ok || i != idx {
			continue
		}
		f, err := os.Open(path)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return internalError("open trace file", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return internalError("stat trace file", err)
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Content-Disposition", `inline; filename="`+filepath.Base(path)+`"`)
		http.ServeContent(w, r, "", fi.ModTime(), f)
		return nil
	}
	return errorf(http.StatusNotFound, omni.CodeNotFound, "trace %d not found", idx)
}
