// Package cputime reads the CPU time that per-operation cost figures divide
// by their operations: this process's (getrusage) and redis-server's (INFO
// cpu: used_cpu_user + used_cpu_sys, summed over the nodes of a cluster).
// The benchmarks, the guard package's cost benchmark and the demo shop's
// metrics all read it here, so their figures count the same thing.
package cputime

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis returns the CPU time redis-server has used since it started: user
// and system, all its threads; for a cluster client, the sum over its
// masters and replicas.
func Redis(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return node(ctx, rdb)
	}
	var mu sync.Mutex // guards total: ForEachShard calls fn concurrently
	var total time.Duration
	err := cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
		d, err := node(ctx, n)
		mu.Lock()
		defer mu.Unlock()
		total += d
		return err
	})
	return total, err
}

// node is Redis for one server.
func node(ctx context.Context, c redis.Cmdable) (time.Duration, error) {
	info, err := c.InfoMap(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("cputime: INFO cpu: %w", err)
	}
	var seconds float64
	for _, name := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info["CPU"][name], 64)
		if err != nil {
			return 0, fmt.Errorf("cputime: INFO cpu %s: %w", name, err)
		}
		seconds += v
	}
	return time.Duration(seconds * float64(time.Second)), nil
}
