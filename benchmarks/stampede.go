package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// StampedeResult: workload 3.
type StampedeResult struct {
	Contender   string
	Processes   int
	Callers     int
	Keys        int
	LoaderCalls int64
	P99         time.Duration
	MaxLatency  time.Duration
}

const (
	stampedeProcs   = 4
	stampedeWorkers = 100
	stampedeKeys    = 10
)

// stampede: 4 OS processes × 100 goroutines on one cold key at a time,
// loader 50 ms, 10 keys. The processes are this binary again ("child").
func stampede(ctx context.Context, e *env, name string) (StampedeResult, error) {
	prefix := e.prefix(name, "stampede")
	existing := ids("s", stampedeKeys)
	c, _, err := e.build(ctx, name, "stampede", 10*time.Minute, existing) // creates the filters
	if err != nil {
		return StampedeResult{}, err
	}
	c.Close()
	self, err := os.Executable()
	if err != nil {
		return StampedeResult{}, err
	}
	var cmds []*exec.Cmd
	outs := make([]strings.Builder, stampedeProcs)
	for i := range stampedeProcs {
		cmd := exec.CommandContext(ctx, self, "child", name, e.addr, prefix)
		cmd.Stdout, cmd.Stderr = &outs[i], os.Stderr
		if err := cmd.Start(); err != nil {
			return StampedeResult{}, err
		}
		cmds = append(cmds, cmd)
	}
	var lat []time.Duration
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return StampedeResult{}, fmt.Errorf("%s: child %d: %w", name, i, err)
		}
		var r childResult
		if err := json.Unmarshal([]byte(outs[i].String()), &r); err != nil {
			return StampedeResult{}, fmt.Errorf("%s: child %d: %w: %q", name, i, err, outs[i].String())
		}
		if r.Errors > 0 {
			return StampedeResult{}, fmt.Errorf("%s: child %d: %d errors, first: %s", name, i, r.Errors, r.FirstError)
		}
		lat = append(lat, r.Latency...)
	}
	var calls int64
	for _, id := range existing {
		n, err := e.admin.Get(ctx, prefix+":calls:"+id).Int64()
		if err != nil {
			return StampedeResult{}, fmt.Errorf("%s: loader counter: %w", name, err)
		}
		calls += n
	}
	slices.Sort(lat)
	if len(lat) != stampedeProcs*stampedeWorkers*stampedeKeys {
		return StampedeResult{}, fmt.Errorf("%s: %d answers, want %d", name, len(lat), stampedeProcs*stampedeWorkers*stampedeKeys)
	}
	return StampedeResult{Contender: name, Processes: stampedeProcs, Callers: len(lat), Keys: stampedeKeys,
		LoaderCalls: calls, P99: pct(lat, 0.99), MaxLatency: lat[len(lat)-1]}, nil
}

type childResult struct {
	Latency    []time.Duration
	Errors     int
	FirstError string
}

// runChild is one stampede process: for each key, wait until all processes
// are ready, then 100 goroutines Get it at once.
func runChild(ctx context.Context, name, addr, prefix string) error {
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	c, err := newContender(ctx, name, setup{addr: addr, prefix: prefix, ttl: 10 * time.Minute, counter: &counter{},
		existing: ids("s", stampedeKeys), opened: true})
	if err != nil {
		return err
	}
	defer c.Close()
	load := func(ctx context.Context, id string) (Value, error) {
		admin.Incr(ctx, prefix+":calls:"+id)
		time.Sleep(50 * time.Millisecond)
		return value(id), nil
	}
	var res childResult
	var mu sync.Mutex
	for k := range stampedeKeys {
		id := "s" + strconv.Itoa(k)
		barrier := prefix + ":barrier:" + id
		admin.Incr(ctx, barrier)
		for {
			n, err := admin.Get(ctx, barrier).Int()
			if err != nil {
				return err
			}
			if n >= stampedeProcs {
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
		var wg sync.WaitGroup
		for range stampedeWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.Now()
				v, err := c.Get(ctx, id, load)
				d := time.Since(t)
				mu.Lock()
				defer mu.Unlock()
				if err == nil && v.ID != id {
					err = fmt.Errorf("wrong value %+v", v)
				}
				if err != nil {
					if res.Errors == 0 {
						res.FirstError = err.Error()
					}
					res.Errors++
				}
				res.Latency = append(res.Latency, d)
			}()
		}
		wg.Wait()
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
