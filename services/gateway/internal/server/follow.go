package server

import (
	"context"
	"time"

	"floe.dev/pkg/bus"
)

// scan delivers the matching messages stored from start, in stream order,
// and returns once it has delivered everything stored when it started.
// created, when set, runs once the consumer exists, before any delivery; its
// error ends the scan.
func (s *Server) scan(ctx context.Context, sid string, classes []string, start uint64, created func() error, fn func(bus.StreamMsg) error) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return bus.Scan(ctx, s.js, sid, classes, start, created, fn)
}
