// Package loader makes a cache miss cost one load per key, however many
// goroutines ask at once, usable without the rest of cacheguard.
//
// One flight per key per process: the callers of one key that a [Group]
// merges share one flight at a time; callers that arrive while it runs join
// it and share its result, and [Group.Forget] makes the next caller start
// anew. The flight runs detached from its first caller's ctx, bounded by
// Timeout: a caller whose ctx ends leaves at once, the flight goes on. A
// panic in the flight reaches every caller as an error wrapping [ErrPanic],
// with its stack; it never crashes the process. It is
// golang.org/x/sync/singleflight with recoverable panics and a typed key.
//
// Across processes, add a Redis lock per key (package lock: Group's example
// shows both; docs/design.md says what cacheguard adds).
package loader
