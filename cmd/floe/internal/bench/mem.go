package bench

import (
	"bufio"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// MemProfileRate is the heap sampling rate the benchmark program sets at
// start (runtime.MemProfileRate), so live heap can be attributed to the code
// that allocated it: fine enough for per-Session figures over thousands of
// Sessions, coarse enough not to slow the throughput runs measurably.
const MemProfileRate = 64 << 10

// Owners of live heap, by the innermost stack frame that belongs to one of
// them (walking out from the allocation site).
const (
	ownerServer = "nats-server"
	ownerClient = "nats.go"
	ownerFloe   = "floe"
	ownerBench  = "bench client"
	ownerOther  = "net/http, runtime"
)

var owners = []string{ownerServer, ownerClient, ownerFloe, ownerBench, ownerOther}

// memSnap is the process's memory at one moment, after a forced GC.
type memSnap struct {
	RSS        int64 // resident set (VmRSS)
	Heap       int64 // live heap bytes (HeapAlloc right after GC)
	Stack      int64 // goroutine stacks (StackInuse)
	Goroutines int
	ByOwner    map[string]int64 // live heap by owner, estimated from the heap profile
}

// snapshot collects garbage, returns freed memory to the OS and measures.
func snapshot() memSnap {
	// Several cycles: each halves the goroutine stacks that use under a
	// quarter of theirs, and the heap profile reflects the last completed
	// cycle.
	for range 4 {
		runtime.GC()
	}
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSnap{
		RSS:        rss(),
		Heap:       int64(ms.HeapAlloc),
		Stack:      int64(ms.StackInuse),
		Goroutines: runtime.NumGoroutine(),
		ByOwner:    heapByOwner(),
	}
}

// rss reads VmRSS from /proc/self/status (0 where there is none).
func rss() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// heapByOwner sums the in-use heap profile by owner, scaling each sampled
// record as pprof does.
func heapByOwner() map[string]int64 {
	var recs []runtime.MemProfileRecord
	for {
		n, _ := runtime.MemProfile(nil, false)
		recs = make([]runtime.MemProfileRecord, n+64)
		n, ok := runtime.MemProfile(recs, false)
		if ok {
			recs = recs[:n]
			break
		}
	}
	rate := float64(runtime.MemProfileRate)
	out := make(map[string]int64, len(owners))
	for i := range recs {
		r := &recs[i]
		inuse := r.InUseBytes()
		if inuse <= 0 {
			continue
		}
		est := float64(inuse)
		if rate > 1 && r.AllocObjects > 0 {
			avg := float64(r.AllocBytes) / float64(r.AllocObjects)
			est /= 1 - math.Exp(-avg/rate)
		}
		out[ownerOf(r.Stack())] += int64(est)
	}
	return out
}

// ownerOf names the owner of the innermost frame that has one.
func ownerOf(stk []uintptr) string {
	if len(stk) == 0 {
		return ownerOther
	}
	frames := runtime.CallersFrames(stk)
	for {
		f, more := frames.Next()
		switch fn := f.Function; {
		case strings.HasPrefix(fn, "github.com/nats-io/nats-server/"):
			return ownerServer
		case strings.HasPrefix(fn, "github.com/nats-io/nats.go"):
			return ownerClient
		case strings.HasPrefix(fn, "floe.dev/cmd/floe/internal/bench"):
			return ownerBench
		case strings.HasPrefix(fn, "floe.dev/"):
			return ownerFloe
		}
		if !more {
			return ownerOther
		}
	}
}

// memDelta is after − before, per unit.
type memDelta struct {
	Units      int
	RSS        float64
	Heap       float64
	Stack      float64
	Goroutines float64
	ByOwner    map[string]float64
}

func deltaPer(before, after memSnap, units int) memDelta {
	u := float64(units)
	d := memDelta{
		Units:      units,
		RSS:        float64(after.RSS-before.RSS) / u,
		Heap:       float64(after.Heap-before.Heap) / u,
		Stack:      float64(after.Stack-before.Stack) / u,
		Goroutines: float64(after.Goroutines-before.Goroutines) / u,
		ByOwner:    make(map[string]float64),
	}
	for _, o := range owners {
		d.ByOwner[o] = float64(after.ByOwner[o]-before.ByOwner[o]) / u
	}
	return d
}
