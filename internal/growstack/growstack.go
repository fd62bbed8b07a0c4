// Package growstack grows a new goroutine's stack to 16 KB in one step,
// before it runs code with deep calls.
//
// A goroutine starts with a 2 KB stack, and the runtime doubles it each
// time a call overflows it: 2 to 4 to 8 to 16 KB, and each step copies the
// stack and walks every frame on it to adjust its pointers. The goroutines
// the guard starts for a miss (the flight, the load, a shared round trip)
// run deep call chains at once: go-redis pipelines and scripts, and the
// application's loader, typically a database driver (modernc.org/sqlite
// parses SQL in a stack of C translated to Go). Growing the stack at the
// goroutine's first line costs one copy of one frame; letting the calls
// grow it costs two or three copies of a deep stack. In the demo shop's
// Zipf scenario this took the stack growth of the guarded path from 2.4 to
// 1.2 µs of CPU per request, and BenchmarkCost's miss from 40 to 36 µs of
// client CPU; `go test -bench . ./internal/growstack` shows the difference
// on a 10 KB call chain: 2.7 µs for a goroutine that grows call by call,
// 0.8 µs for one that calls Grow first.
//
// The idea is CockroachDB's (pkg/util/growstack), which does it with an
// assembly function whose frame needs no zeroing; this one is plain Go and
// zeroes 12 KB, about 0.3 µs, to stay portable.
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
