package main

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// followGoRun ends floe with its parent when that parent is the go tool
// (`go run ./cmd/floe serve &`, then `kill $!`): go run does not pass a
// signal on to the program it started, which went on serving with
// nobody to stop it. The kernel sends SIGTERM when the parent dies, and
// floe shuts down as on any SIGTERM. Other parents (a shell, nohup, a
// service manager) are left alone: a server may outlive them.
//
// The setting belongs to the thread that makes the request and is lost
// when that thread exits (the Go runtime ends threads a locked goroutine
// leaves), so it is made from init on the main thread, which lives as
// long as the process.
func init() {
	runtime.LockOSThread()
	followGoRun()
	runtime.UnlockOSThread()
}

func followGoRun() {
	ppid := os.Getppid()
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(ppid) + "/comm")
	if err != nil || strings.TrimSpace(string(comm)) != "go" {
		return
	}
	if unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0) != nil {
		return
	}
	if os.Getppid() != ppid { // it died before the request took effect
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
}
