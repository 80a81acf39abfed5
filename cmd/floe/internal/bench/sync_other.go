//go:build !unix

package bench

func syncDisks() {}
