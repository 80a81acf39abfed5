//go:build !linux

package main

// followGoRun is Linux-only (the parent-death signal).
func followGoRun() {}
