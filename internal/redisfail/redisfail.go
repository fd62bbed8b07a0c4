// Package redisfail owns the one sentinel that every Redis failure in
// cacheguard wraps, whatever package it surfaces from (guard, bloom, lock,
// loader): a caller writes a single errors.Is(err, guard.ErrUnavailable)
// branch, and the sentinel re-exported by guard, bloom and lock is this one
// value.
//
// A Redis failure is anything but an answer: a dial or I/O error, a timeout
// or a cancelled context while waiting for Redis, and an error reply (OOM
// under maxmemory, NOPERM from an ACL, READONLY, CLUSTERDOWN, ...). redis.Nil
// is an answer ("no such key") and is never wrapped.
package redisfail

import (
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable is wrapped by every error caused by Redis failing to answer.
var ErrUnavailable = errors.New("cacheguard: redis unavailable")

// Wrap returns err wrapping ErrUnavailable (and still wrapping err). nil,
// redis.Nil and errors that already wrap ErrUnavailable come back unchanged.
func Wrap(err error) error {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
