// Package growstack grows a new goroutine's stack to 16 KB in one step,
// before it runs code with deep calls (go-redis pipelines, a database
// driver): one copy of one small frame, instead of the runtime's two or
// three doublings, each copying a deep stack. The idea is CockroachDB's
// (pkg/util/growstack); this one is plain Go. docs/design-notes.md has the
// figures.
package growstack

// frame is the size of Grow's frame. With the caller's frames and the
// stack guard on top, the runtime grows a 2 KB stack straight to 16 KB
// (it doubles until the frame fits), the largest size it keeps in its
// per-P cache of free stacks.
const frame = 12 << 10

// Grow grows the calling goroutine's stack to at least 16 KB now, in one
// copy, if it is smaller. Call it first thing in a new goroutine that will
// make deep calls; in a goroutine whose stack is already grown it costs the
// zeroing of its frame.
//
//go:noinline
func Grow() {
	var buf [frame]byte
	use(buf[:])
}

// use keeps buf, and so Grow's frame, from being optimised away.
//
//go:noinline
func use([]byte) {}
