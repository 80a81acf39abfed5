// Package retry is the one way the Floe services wait between tries: an
// exponential backoff from github.com/cenkalti/backoff/v5 (a small,
// well-kept library: a context-aware Retry, permanent errors, a notify
// hook, an elapsed-time limit) with the services' defaults, and one
// context-aware Sleep for the polls that are not retries.
//
// The backoffs here have no jitter: their waits are the ones the services
// report (a request_end's retry_in_ms) and the ones their tests expect.
package retry

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Exponential returns a backoff that waits first, then doubles each time,
// never more than most; it never stops by itself (Do's within bounds the
// tries).
func Exponential(first, most time.Duration) *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval: first,
		Multiplier:      2,
		MaxInterval:     most,
	}
	b.Reset()
	return b
}

// Constant returns a backoff that always waits d.
func Constant(d time.Duration) backoff.BackOff { return backoff.NewConstantBackOff(d) }

// Nth is the wait after failed try n (from 1) of Exponential(first,
// most): first·2^(n-1), capped at most.
func Nth(first, most time.Duration, n int) time.Duration {
	b := Exponential(first, most)
	d := b.NextBackOff()
	for i := 1; i < n; i++ {
		d = b.NextBackOff()
	}
	return min(d, most)
}

// Do runs op until it succeeds or:
//   - op returns an error marked Permanent: Do returns the error inside;
//   - ctx ends: Do returns op's last result and ctx.Err();
//   - the next wait would end more than within after the first try
//     (0: no limit): Do returns op's last result and error.
//
// Between tries it waits as b says and, when notify is set, first tells
// it the error and the wait.
func Do[T any](ctx context.Context, b backoff.BackOff, within time.Duration, op func() (T, error), notify func(err error, wait time.Duration)) (T, error) {
	opts := []backoff.RetryOption{backoff.WithBackOff(b), backoff.WithMaxElapsedTime(within)}
	if notify != nil {
		opts = append(opts, backoff.WithNotify(notify))
	}
	res, err := backoff.Retry(ctx, op, opts...)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
		err = ctx.Err()
	}
	return res, err
}

// Permanent marks err as one no retry can help; nil stays nil.
func Permanent(err error) error { return backoff.Permanent(err) }

// Sleep waits d, or until ctx ends; it returns ctx.Err() then, nil
// otherwise. A d of 0 or less does not wait (and starts no timer): it
// only reports whether ctx has ended.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
