package main

import (
	"cmp"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// stopAfterHit: -hit-only; hotKeyOnly: -hot-only, with hotOnlyPause
// (-hot-pause); hotKeyShape: -hot-ttl and -hot-load; staleKeyOnly:
// -stale-only.
var (
	stopAfterHit, hotKeyOnly, staleKeyOnly bool
	hotOnlyPause                           time.Duration
	hotKeyShape                            = hotShape{ttl: hotTTLDefault, load: hotLoadDefault}
)

func field(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return "?"
}

func machine() string {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cpu = field(string(b), "model name\t")
		if cpu == "?" {
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, "model name") {
					cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
					break
				}
			}
		}
	}
	return fmt.Sprintf("%d cores, %s, %s/%s, %s", runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// cpuPair prints a Get's CPU time, client + Redis, in microseconds.
func cpuPair(client, server time.Duration) string {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return fmt.Sprintf("%.2f + %.2f µs", us(client), us(server))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// msFine is ms to the microsecond, for the hit path's latencies (a local
// hit's p99 is a few µs).
func msFine(d time.Duration) string {
	return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond))
}

// markdownHit is table 1, the hit path.
func markdownHit(r *Report) string {
	var b strings.Builder
	fmt.Fprintf(
		&b,
		"**1. Hit path** (10,000 warm keys, 64 goroutines asking again at once, every 8th Get timed; median of %d runs, "+
			"order rotated; \"vs raw\" is the median of same-run ratios, each run's in brackets)\n",
		len(r.Hit[0].VsRawRuns),
	)
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| contender | ops/s | vs raw | p50 | p99 | round trips/Get | server commands/Get | allocs/op | CPU/Get: client + Redis |")
	fmt.Fprintln(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, h := range r.Hit {
		trips := fmt.Sprintf("%.2f", h.TripsPerGet)
		switch {
		case h.TripsPerGet == 0 && strings.HasPrefix(h.Contender, "go-zero"):
			trips = "n/a¹"
		case strings.HasPrefix(h.Contender, "rueidis"):
			trips = "n/a²"
		case h.Contender == "go-redis+client-cache":
			trips = "n/a³"
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.2f× (%s) | %s | %s | %s | %.2f | %.0f | %s |\n", h.Contender, h.OpsPerSec, h.VsRaw, joinFloats(h.VsRawRuns),
			msFine(h.P50), msFine(h.P99), trips, h.ServerCmdsPerOp, h.AllocsPerOp, cpuPair(h.ClientCPU, h.ServerCPU))
	}
	fmt.Fprintln(
		&b,
		"\n¹ go-zero keeps one client per address, so the second go-zero contender's hook is never "+
			"installed. ² rueidis is not a go-redis client: the hook that counts round trips is not on it. "+
			"³ go-redis runs hooks before its client-side cache answers: the hook is left off. "+
			"Server commands count the commands Lua scripts run, too.",
	)
	for _, h := range r.Hit {
		if h.Reference != "" {
			q := slices.Sorted(slices.Values(h.VsRefRuns))
			fmt.Fprintf(&b, "\n%s against %s, interleaved: %.2f× its ops/s (median of %d pairs of %v slices, middle half %.2f to %.2f)\n",
				h.Contender, h.Reference, h.VsRef, len(q), hitSlice, q[len(q)/4], q[(3*len(q)-1)/4])
		}
	}
	return b.String()
}

// markdownHot is table 4 (pause 100 µs) or 4b (pause 0: the clients
// yield instead), the hot key.
func markdownHot(number string, rs []HotKeyResult, pause time.Duration) string {
	var b strings.Builder
	pacing := fmt.Sprintf("each asking again %v after its answer", pause)
	if us := pause / time.Microsecond; pause < time.Millisecond && us*time.Microsecond == pause {
		pacing = fmt.Sprintf("each asking again %d µs after its answer", us)
	}
	switch {
	case pause == 0:
		pacing = "each yielding the processor between Gets instead of pausing"
	case pause < 0:
		pacing = "each asking again at once"
	}
	shape := hotShape{ttl: hotTTLDefault, load: hotLoadDefault, clients: 32}
	if len(rs) > 0 && rs[0].TTL > 0 {
		shape = hotShape{ttl: rs[0].TTL, load: rs[0].LoadTime, clients: cmp.Or(rs[0].Clients, 32)}
	}
	ttl, load := shortDuration(shape.ttl), shortDuration(shape.load)
	fmt.Fprintf(
		&b,
		"\n**%s. Hot key expiring under load** (%d clients, %s; one warm key, TTL %s, loader %s; "+
			"\"Gets ≥ %s\" counts the callers that took as long as a load: waiting for one, or a Redis "+
			"round trip that slow)\n",
		number,
		shape.clients,
		pacing,
		ttl,
		load,
		load,
	)
	fmt.Fprintln(&b)
	fmt.Fprintf(
		&b,
		"Each contender ran once per round, the order rotated between rounds. Gets and max are the "+
			"medians of its rounds (each round in brackets); the other columns are from its median-Gets "+
			"round. Max and \"Gets ≥ %s\" count every Get; p99 comes from a uniform sample of up to "+
			"32,768 Gets per client. \"Entry absent\" is the share of the run the key was not in Redis "+
			"on Redis's clock (a probe every millisecond): from its expiry to its refill, the fill time "+
			"cacheguard's entries carry or, for the others, the midpoint of the probes around it; the "+
			"median of the rounds.\n",
		load,
	)
	fmt.Fprintln(&b)
	fmt.Fprintf(&b, "| contender | Gets (rounds) | loader calls | loads/s | expiries | p99 | max (rounds) | Gets ≥ %s | entry absent (rounds) |\n", load)
	fmt.Fprintln(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, h := range rs {
		fmt.Fprintf(&b, "| %s | %d (%s) | %d | %.1f | %.0f | %s | %s (%s) | %d | %s (%s) |\n", h.Contender, h.Gets, joinInts(h.GetsRuns),
			h.LoaderCalls, h.LoadsPerSecond, h.Expiries, ms(h.P99), ms(h.Max), joinDurations(h.MaxRuns), h.Slow, percent(h.Absent), joinPercents(h.AbsentRuns))
		if h.Errors > 0 {
			fmt.Fprintf(&b, "|   (%s: %d Gets failed) | | | | | | | | |\n", h.Contender, h.Errors)
		}
	}
	return b.String()
}

// shortDuration writes d the way the tables do: "1 s", "200 ms", "10 ms".
func shortDuration(d time.Duration) string {
	switch {
	case d >= time.Second && d%time.Second == 0:
		return fmt.Sprintf("%d s", d/time.Second)
	case d >= time.Millisecond && d%time.Millisecond == 0:
		return fmt.Sprintf("%d ms", d/time.Millisecond)
	}
	return d.String()
}

func markdown(r *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s on %s, redis-server %s, all contenders on the same server, one after another.\n\n", r.Date, r.Machine, r.Redis)

	b.WriteString(markdownHit(r))
	fmt.Fprintln(&b, "\n**2. Penetration** (20,000 distinct nonexistent IDs, 10,000 existing)")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| contender | loader calls | ops/s |")
	fmt.Fprintln(&b, "|---|---:|---:|")
	for _, p := range r.Penetration {
		fmt.Fprintf(&b, "| %s | %d | %.0f |\n", p.Contender, p.LoaderCalls, p.OpsPerSec)
	}
	fmt.Fprintln(&b, "\n**3. Cross-process stampede** (4 processes × 100 goroutines on one cold key, loader 50 ms, 10 keys; ideal: 10 loader calls)")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| contender | loader calls | p99 | max |")
	fmt.Fprintln(&b, "|---|---:|---:|---:|")
	for _, s := range r.Stampede {
		fmt.Fprintf(&b, "| %s | %d | %s | %s |\n", s.Contender, s.LoaderCalls, ms(s.P99), ms(s.MaxLatency))
	}
	b.WriteString(markdownHot("4", r.HotKey, hotPauseDefault))
	b.WriteString(markdownHot("4b", r.HotKeyYield, 0))
	for _, rs := range r.HotKeyAtOnce {
		b.WriteString(markdownHot("4c", rs, -time.Nanosecond))
	}
	fmt.Fprintln(&b, "\n**5. Avalanche** (5,000 keys loaded at once, TTL 10 min)")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| contender | min TTL | max TTL | std dev | spread (max−min)/TTL |")
	fmt.Fprintln(&b, "|---|---:|---:|---:|---:|")
	for _, a := range r.Avalanche {
		fmt.Fprintf(
			&b,
			"| %s | %s | %s | %s | %.1f%% |\n",
			a.Contender,
			a.Min.Round(time.Second),
			a.Max.Round(time.Second),
			a.StdDev.Round(time.Second),
			100*a.Spread,
		)
	}
	fmt.Fprintln(&b, "\n**6. Bloom filter memory** (1,000,000 IDs, 1% target; bound n·log2(1/p)/8 bytes; FP measured over 100,000 absent IDs)")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| filter | bits/item | bytes in Redis | vs bound | measured FP |")
	fmt.Fprintln(&b, "|---|---:|---:|---:|---:|")
	for _, m := range r.Memory {
		fmt.Fprintf(&b, "| %s | %.2f | %d | %.2f× | %.3f%% |\n", m.Filter, m.BitsPerItem, m.Bytes, m.VsBound, 100*m.MeasuredFP)
	}
	if len(r.Staleness) > 0 {
		b.WriteString(markdownStale(r.Staleness))
	}
	return b.String()
}

// joinInts formats the rounds' counts for a table cell: "1, 2, 3".
func joinInts(v []int64) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(s, ", ")
}

// joinFloats formats ratios for a table cell: "0.87, 0.94".
func joinFloats(v []float64) string {
	s := make([]string, len(v))
	for i, f := range v {
		s[i] = fmt.Sprintf("%.2f", f)
	}
	return strings.Join(s, ", ")
}

// joinDurations formats rounds' durations in milliseconds: "1.20, 3.40".
func joinDurations(v []time.Duration) string {
	s := make([]string, len(v))
	for i, d := range v {
		s[i] = fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond))
	}
	return strings.Join(s, ", ")
}

// percent writes a share as the tables do: "9.1%".
func percent(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func joinPercents(v []float64) string {
	s := make([]string, len(v))
	for i, f := range v {
		s[i] = percent(f)
	}
	return strings.Join(s, ", ")
}
