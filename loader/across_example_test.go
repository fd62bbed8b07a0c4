package loader_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/loader"
	"github.com/cacheguard/cacheguard/lock"
)

// fencedSet writes KEYS[1] for ARGV[3] ms only while the lock KEYS[2] still
// holds the holder's token ARGV[1].
var fencedSet = redis.NewScript(`
if redis.call("GET", KEYS[2]) ~= ARGV[1] then return 0 end
redis.call("SET", KEYS[1], ARGV[2], "PX", ARGV[3])
return 1`)

// One load per key across processes: a Group merges each process's callers
// into one flight, and the flights of different processes take turns
// through a Redis lock (package lock). The lock attempt carries the
// re-check (a GET queued behind it), so a flight that wins the lock after
// another process filled the key reads that instead of loading; the write
// is fenced by the lock's token. Here two Groups stand for two processes.
// (cacheguard's guard wakes its waiters by a PUBLISH instead of polling.)
func Example_acrossProcesses() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	locks := lock.New(rdb)
	key := fmt.Sprintf("example:{user-%d}", time.Now().UnixNano())
	var loads atomic.Int32

	fill := func(ctx context.Context) (string, error) {
		for {
			pipe := rdb.Pipeline()
			q, err := locks.Queue(ctx, pipe, key+":lock", 5*time.Second)
			if err != nil {
				return "", err
			}
			cached := pipe.Get(ctx, key) // with the lock taken: the winner's re-check
			_, _ = pipe.Exec(ctx)
			if v, err := cached.Result(); err == nil {
				return v, nil // another process filled it
			}
			l, err := q.Result(ctx)
			if errors.Is(err, lock.ErrNotObtained) {
				time.Sleep(10 * time.Millisecond) // another process loads: read again soon
				continue
			}
			if err != nil {
				return "", err
			}
			stop := l.KeepAlive(ctx, 5*time.Second, nil)
			loads.Add(1)
			time.Sleep(50 * time.Millisecond) // the slow query
			v := "Ada"
			stop()
			_ = fencedSet.Run(ctx, rdb, []string{key, key + ":lock"}, l.Token(), v, time.Minute.Milliseconds()).Err()
			_ = l.Release(ctx)
			return v, nil
		}
	}

	var processes [2]loader.Group[string, string]
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if _, _, err := processes[i%2].Do(ctx, key, fill); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("loads:", loads.Load(), "cached:", rdb.Get(ctx, key).Val())
	// Output: loads: 1 cached: Ada
}
