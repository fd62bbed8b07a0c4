package main

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheguard/cacheguard/guard"
)

// StaleResult: workload 7, how long a reader's in-process copy serves a
// value after another client wrote a newer one.
type StaleResult struct {
	Contender     string // the reader
	Write         string // what the writer's client does
	Writes        int    // writes measured in the median round
	P50, P99, Max time.Duration
	P99Runs       []time.Duration // each round's p99 (the row: their median)
	MaxRuns       []time.Duration // each round's slowest (the row: their median)
}

// staleCase is one row of table 7: a reader contender with an in-process
// copy, the contender whose client writes (its own Guard or client, its own
// connections: the write reaches the reader only through Redis, as one
// from another process does), and how it writes.
type staleCase struct {
	reader, writer, write string
	invalidate            bool // drop the entry (the reader loads the new value) instead of writing it
}

var staleCases = []staleCase{
	{"cacheguard+local", "cacheguard", "Set", false},
	{"cacheguard+local", "cacheguard", "Invalidate", true},
	{"go-redis+client-cache", "raw", "SET", false},
	{"go-redis+client-cache", "raw", "DEL", true},
}

func (c staleCase) label() string { return c.reader + ": " + c.write }

// staleWriter is a contender that can write an ID's cached value, or drop
// it, after the source of truth changed.
type staleWriter interface {
	set(ctx context.Context, id string, v Value) error
	invalidate(ctx context.Context, id string) error
}

func (c *cacheguard) set(ctx context.Context, id string, v Value) error {
	return guard.Set(ctx, c.g, id, v)
}
func (c *cacheguard) invalidate(ctx context.Context, id string) error { return c.g.Invalidate(ctx, id) }

func (r *raw) set(ctx context.Context, id string, v Value) error {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return err
	}
	return r.rdb.Set(ctx, r.RedisKey(id), b, r.ttl).Err()
}
func (r *raw) invalidate(ctx context.Context, id string) error {
	return r.rdb.Del(ctx, r.RedisKey(id)).Err()
}

const (
	staleKeys    = 100 // keys written in each wave
	staleWaves   = 5   // waves per round: 500 writes
	staleTimeout = 10 * time.Second
)

// staleness: a reader with an in-process copy sweeps 100 warm keys, Get
// after Get, while another client writes each of them once in a wave (a
// random pause of up to 1 ms between writes, up to 200 ms between waves,
// so that the copies are of every age when their write lands). A key's
// staleness is from the moment its write returned to the first Get of the
// reader that answers the new value (0 if one did before). Between Gets
// the reader yields the processor, so the writer's and the clients'
// goroutines run.
func staleness(ctx context.Context, e *env, c staleCase, round int) (StaleResult, error) {
	keys := ids("w", staleKeys)
	workload := "stale" + strconv.Itoa(round) + strings.ToLower(c.write)
	rd, _, err := e.build(ctx, c.reader, workload, 10*time.Minute, keys)
	if err != nil {
		return StaleResult{}, err
	}
	defer rd.Close()
	wc, err := newContender(ctx, c.writer, setup{addr: e.addr, prefix: e.prefix(c.reader, workload), ttl: 10 * time.Minute,
		existing: keys, counter: &counter{}, opened: true})
	if err != nil {
		return StaleResult{}, fmt.Errorf("%s: writer: %w", c.label(), err)
	}
	defer wc.Close()
	w, ok := wc.(staleWriter)
	if !ok {
		return StaleResult{}, fmt.Errorf("%s: %s cannot write", c.label(), c.writer)
	}
	// db is the source of truth: each key's version (0: value(id) as is).
	db := make([]atomic.Int64, staleKeys)
	at := func(id string, version int64) Value {
		v := value(id)
		if version > 0 {
			v.Price = version
		}
		return v
	}
	load := func(_ context.Context, id string) (Value, error) {
		j, _ := strconv.Atoi(id[1:])
		return at(id, db[j].Load()), nil
	}
	for _, id := range keys {
		if _, err := rd.Get(ctx, id, load); err != nil {
			return StaleResult{}, fmt.Errorf("%s: warm-up: %w", c.label(), err)
		}
	}
	r := rand.New(rand.NewPCG(uint64(round), 11))
	var lat []time.Duration
	for wave := range staleWaves {
		time.Sleep(time.Duration(r.Int64N(int64(200 * time.Millisecond))))
		version := int64(1_000_000 + wave)
		wrote := make([]atomic.Int64, staleKeys) // when each key's write returned (Unix ns)
		done := make(chan error, 1)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j, id := range keys {
				time.Sleep(time.Duration(r.Int64N(int64(time.Millisecond))))
				db[j].Store(version)
				var err error
				if c.invalidate {
					err = w.invalidate(ctx, id)
				} else {
					err = w.set(ctx, id, at(id, version))
				}
				if err != nil {
					done <- err
					return
				}
				wrote[j].Store(time.Now().UnixNano())
			}
		}()
		seen, left, began := make([]bool, staleKeys), staleKeys, time.Now()
		var failed error
		for left > 0 && failed == nil {
			for j, id := range keys {
				if seen[j] {
					continue
				}
				v, err := rd.Get(ctx, id, load)
				now := time.Now()
				if err != nil {
					failed = err
					break
				}
				if v.Price == version {
					for wrote[j].Load() == 0 { // the write's client has answered; its goroutine is about to note when
						runtime.Gosched()
					}
					lat = append(lat, max(0, now.Sub(time.Unix(0, wrote[j].Load()))))
					seen[j], left = true, left-1
				}
				runtime.Gosched()
			}
			select {
			case failed = <-done:
			default:
			}
			if time.Since(began) > staleTimeout {
				failed = fmt.Errorf("%d of %d keys still old after %v", left, staleKeys, staleTimeout)
			}
		}
		wg.Wait()
		if failed != nil {
			return StaleResult{}, fmt.Errorf("%s: wave %d: %w", c.label(), wave, failed)
		}
	}
	slices.Sort(lat)
	return StaleResult{Contender: c.reader, Write: c.write, Writes: len(lat), P50: pct(lat, 0.5), P99: pct(lat, 0.99), Max: lat[len(lat)-1]}, nil
}

// medianStale is a case's row over its rounds: the round with the median
// p99, with Max the median of the rounds' slowest, every round's kept.
func medianStale(runs []StaleResult) StaleResult {
	byP99 := slices.Clone(runs)
	slices.SortFunc(byP99, func(a, b StaleResult) int { return cmp.Compare(a.P99, b.P99) })
	m := byP99[len(byP99)/2]
	m.P99Runs, m.MaxRuns = nil, nil
	for _, r := range runs {
		m.P99Runs = append(m.P99Runs, r.P99)
		m.MaxRuns = append(m.MaxRuns, r.Max)
	}
	maxes := slices.Clone(m.MaxRuns)
	slices.Sort(maxes)
	m.Max = maxes[len(maxes)/2]
	return m
}

// markdownStale is table 7.
func markdownStale(rs []StaleResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n**7. Staleness of an in-process copy after a write by another client** (%d keys read in a loop, each written %d times "+
		"by another Guard or client on its own connections; from the write's return to the reader's first Get answering the new value; "+
		"standalone redis-server only)\n", staleKeys, staleWaves)
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "Each case ran once per round, the order rotated between rounds; p99 and max are the medians of its rounds (each round in brackets).")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| reader | write | writes/round | p50 | p99 (rounds) | max (rounds) |")
	fmt.Fprintln(&b, "|---|---|---:|---:|---:|---:|")
	for _, s := range rs {
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s (%s) | %s (%s) |\n", s.Contender, s.Write, s.Writes, msFine(s.P50),
			msFine(s.P99), joinDurations(s.P99Runs), msFine(s.Max), joinDurations(s.MaxRuns))
	}
	return b.String()
}
