//go:build !linux

package main

// Following a go run parent is Linux-only (the parent-death signal).
