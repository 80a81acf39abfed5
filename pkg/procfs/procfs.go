// Package procfs reads Linux's /proc for tests that check which processes
// run: a process's state, parent, arguments and environment, the live
// processes matching a test's marker, and the descendants of a process (a
// confined tool's processes are its runner's grandchildren and below).
// Standard library only, so every module's tests can use it; a process
// that ends while it is being read is simply not listed.
package procfs

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// Process is what /proc/<pid>/stat says of a process.
type Process struct {
	PID, PPID int
	// State is one letter: R running, S sleeping, D disk wait, Z zombie,
	// X dead, T stopped, …
	State string
	// PGID is the process group, Session the session (its leader's pid).
	PGID, Session int
}

// Live reports whether the process runs: neither a zombie nor dead.
func (p Process) Live() bool { return p.State != "Z" && p.State != "X" }

// Stat reads pid's stat line; ok is false when there is no such process.
func Stat(pid int) (p Process, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Process{}, false
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return Process{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return Process{}, false
	}
	var n [3]int
	for j := range n {
		if n[j], err = strconv.Atoi(f[j+1]); err != nil {
			return Process{}, false
		}
	}
	return Process{PID: pid, PPID: n[0], State: f[0], PGID: n[1], Session: n[2]}, true
}

// Alive reports whether pid is a live process (a zombie is not).
func Alive(pid int) bool {
	p, ok := Stat(pid)
	return ok && p.Live()
}

// Args returns pid's arguments, argv[0] first; none for a zombie, a kernel
// thread or a process that is gone.
func Args(pid int) []string { return nulList(pid, "cmdline") }

// Environ returns pid's environment as KEY=value entries (readable for
// processes of the same user).
func Environ(pid int) []string { return nulList(pid, "environ") }

func nulList(pid int, file string) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/" + file)
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// All returns every process, live or not, by pid.
func All() []Process {
	entries, _ := os.ReadDir("/proc")
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := Stat(pid); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out
}

// Find returns the pids of the live processes whose arguments match, by
// pid.
func Find(match func(pid int, args []string) bool) []int {
	var pids []int
	for _, p := range All() {
		if p.Live() && match(p.PID, Args(p.PID)) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// WithArgs returns the pids of the live processes whose arguments hold
// run, in order and next to each other: WithArgs("sleep", "30.5") finds
// `sleep 30.5`, WithArgs(marker) any process given marker.
func WithArgs(run ...string) []int {
	return Find(func(_ int, args []string) bool { return HasArgs(args, run...) })
}

// HasArgs reports whether args holds run in order, next to each other.
func HasArgs(args []string, run ...string) bool {
	if len(run) == 0 {
		return true
	}
	for i := 0; i+len(run) <= len(args); i++ {
		if slices.Equal(args[i:i+len(run)], run) {
			return true
		}
	}
	return false
}

// DescendsFrom reports whether ancestor is among pid's parents, theirs,
// and so on (at most 64 generations).
func DescendsFrom(pid, ancestor int) bool {
	for range 64 {
		p, ok := Stat(pid)
		if !ok || p.PPID <= 0 {
			return false
		}
		if p.PPID == ancestor {
			return true
		}
		pid = p.PPID
	}
	return false
}

// Descendants returns the live processes below pid (its children, theirs,
// and so on), by pid.
func Descendants(pid int) []int {
	children := map[int][]int{}
	live := map[int]bool{}
	for _, p := range All() {
		children[p.PPID] = append(children[p.PPID], p.PID)
		live[p.PID] = p.Live()
	}
	var out []int
	queue := slices.Clone(children[pid])
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		if live[c] {
			out = append(out, c)
		}
		queue = append(queue, children[c]...)
	}
	slices.Sort(out)
	return out
}
