package redistest

import (
	"bytes"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Parked counts the descendants of goroutine root (the goroutines it
// started, and theirs, while their parents live) that wait with at in the
// name of their top function, and within anywhere in their trace ("" for
// any): a test's callers that joined a flight, or queued for a round trip.
// The library keeps no hook for its tests: they read the goroutine stacks.
func Parked(root int, at, within string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	type goroutine struct {
		parent int
		counts bool
	}
	all := map[int]goroutine{}
	for _, rec := range bytes.Split(buf, []byte("\n\n")) {
		lines := strings.Split(string(rec), "\n")
		id, state, ok := header(lines[0])
		if !ok {
			continue
		}
		g := goroutine{}
		for _, l := range lines {
			if _, p, found := strings.Cut(l, " in goroutine "); found && strings.HasPrefix(l, "created by ") {
				g.parent, _ = strconv.Atoi(p)
			}
		}
		waiting := state != "running" && state != "runnable" && state != "syscall" && state != "preempted"
		if waiting && len(lines) > 1 && strings.Contains(frame(lines[1]), at) &&
			(within == "" || strings.Contains(string(rec), within)) {
			g.counts = true
		}
		all[id] = g
	}
	n := 0
	for _, g := range all {
		if !g.counts {
			continue
		}
		for p := g.parent; p != 0; p = all[p].parent {
			if p == root {
				n++
				break
			}
			if _, live := all[p]; !live {
				break
			}
		}
	}
	return n
}

// WaitParked waits until n of the calling goroutine's descendants are
// Parked(at, within), failing t after 20 s.
func WaitParked(t testing.TB, n int, at, within string) {
	t.Helper()
	self := GoID()
	Eventually(t, 20*time.Second, strconv.Itoa(n)+" goroutines waiting in "+at, func() bool { return Parked(self, at, within) >= n })
}

// GoID is the calling goroutine's number, as stack traces give it.
func GoID() int {
	var buf [64]byte
	id, _, _ := header(string(buf[:runtime.Stack(buf[:], false)]))
	return id
}

// header parses "goroutine 12 [select, 2 minutes]:" (with GOTRACEBACK=system,
// "goroutine 12 gp=0x… m=nil [select]:").
func header(line string) (id int, state string, ok bool) {
	rest, found := strings.CutPrefix(line, "goroutine ")
	if !found {
		return 0, "", false
	}
	num, _, _ := strings.Cut(rest, " ")
	_, rest, found = strings.Cut(rest, "[")
	if !found {
		return 0, "", false
	}
	id, err := strconv.Atoi(num)
	if err != nil {
		return 0, "", false
	}
	state, _, _ = strings.Cut(rest, "]")
	state, _, _ = strings.Cut(state, ",")
	return id, state, true
}

// frame is a stack line's function name, without its arguments.
func frame(line string) string {
	if i := strings.LastIndex(line, "("); i > 0 {
		return line[:i]
	}
	return line
}
