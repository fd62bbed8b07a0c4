// Package loader makes a cache miss cost one load per key, however many callers ask at once.
//
// One flight per key per process: a [Group] merges the concurrent callers of a key into one
// flight, whose result they share; [Group.Forget] makes the next caller start anew. The flight
// runs detached from its first caller's ctx, bounded by Timeout (a caller whose ctx ends leaves
// at once), and its panic reaches every caller as an error wrapping [ErrPanic], never a crash.
// Group is golang.org/x/sync/singleflight with recoverable panics and a typed key, usable alone.
//
// One load per key across processes: under a [Coordinator], only the holder of the key's Redis
// lock (package lock) loads, after a re-check made with the lock taken. It writes the result,
// releases the lock and publishes to the waiters in one script, and writes only while the lock
// holds its token (a write to the source of truth deletes it: that load is refused and runs
// again); a holder that does not write still releases and publishes. The others wait for the
// publish and read what it stored; a Coordinator writes the guard's Redis layout (docs/design.md).
package loader
