package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/lock"
)

// fencedSet writes KEYS[1] only while the lock KEYS[2] still holds the
// holder's token ARGV[1]: a holder whose lock expired writes nothing.
var fencedSet = redis.NewScript(`
if redis.call("GET", KEYS[2]) ~= ARGV[1] then return 0 end
redis.call("SET", KEYS[1], ARGV[2])
return 1`)

// A fenced write: the holder's write checks its token in the same script,
// so a holder that lost its lock (it expired while the process was paused,
// and another took it) cannot overwrite the next holder's work.
func ExampleLock_Token() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	locks := lock.New(rdb)
	data, key := "example:{report-7}", "example:{report-7}:lock"

	first, _ := locks.Obtain(ctx, key, 50*time.Millisecond, nil)
	time.Sleep(100 * time.Millisecond) // paused past its lease: the lock lapses
	second, _ := locks.Obtain(ctx, key, time.Second, nil)

	n, _ := fencedSet.Run(ctx, rdb, []string{data, key}, second.Token(), "second's").Int()
	fmt.Println("second wrote:", n)
	n, _ = fencedSet.Run(ctx, rdb, []string{data, key}, first.Token(), "first's").Int()
	fmt.Println("first wrote:", n, "; data:", rdb.Get(ctx, data).Val())
	fmt.Println(errors.Is(first.Release(ctx), lock.ErrNotHeld), second.Release(ctx))
	// Output:
	// second wrote: 1
	// first wrote: 0 ; data: second's
	// true <nil>
}

// Lock and read in one round trip: the GET queued behind the attempt runs
// with the lock taken, so the winner's read is its re-check (did someone
// else fill it while we were deciding to?).
func ExampleClient_Queue() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	locks := lock.New(rdb)
	data := fmt.Sprintf("example:{report-%d}", time.Now().UnixNano())

	pipe := rdb.Pipeline()
	q, err := locks.Queue(ctx, pipe, data+":lock", time.Second)
	if err != nil {
		panic(err)
	}
	cached := pipe.Get(ctx, data)
	_, _ = pipe.Exec(ctx) // errors are read per command
	l, err := q.Result(ctx)
	if err != nil {
		fmt.Println("another holder fills it:", errors.Is(err, lock.ErrNotObtained))
		return
	}
	if errors.Is(cached.Err(), redis.Nil) { // held, and still empty: fill it
		n, _ := fencedSet.Run(ctx, rdb, []string{data, data + ":lock"}, l.Token(), "filled").Int()
		fmt.Println("filled:", n)
	}
	fmt.Println(l.Release(ctx), rdb.Get(ctx, data).Val())
	// Output:
	// filled: 1
	// <nil> filled
}

// Obtain, keep alive while working, release.
func Example() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	locks := lock.New(rdb)

	// The hash tag keeps the lock in the slot of what it guards.
	l, err := locks.Obtain(ctx, "example:{report-42}:lock", 5*time.Second, nil)
	if err != nil {
		panic(err)
	}
	stop := l.KeepAlive(ctx, 5*time.Second, func(err error) { fmt.Println("lost:", err) })

	_, err = locks.Obtain(ctx, "example:{report-42}:lock", time.Second, nil)
	fmt.Println(errors.Is(err, lock.ErrNotObtained))

	// ... work; a write that must not land after the lock expired checks
	// l.Token() against the lock key in the same script ...
	stop()
	fmt.Println(l.Release(ctx))
	fmt.Println(errors.Is(l.Release(ctx), lock.ErrNotHeld))
	// Output:
	// true
	// <nil>
	// true
}

// Waiting for a holder: Obtain retries until Options.Wait runs out.
func ExampleClient_Obtain() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	locks := lock.New(rdb)

	holder, _ := locks.Obtain(ctx, "example:{report-8}:lock", 50*time.Millisecond, nil) // lapses in 50ms
	l, err := locks.Obtain(ctx, "example:{report-8}:lock", time.Second, &lock.Options{Wait: time.Second})
	fmt.Println(err, l.Token() != holder.Token())
	_ = l.Release(ctx)
	// Output:
	// <nil> true
}

// A lock whose TTL ran out is no longer the holder's: Refresh says so.
func ExampleLock_Refresh() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	l, _ := lock.New(rdb).Obtain(ctx, "example:{report-9}:lock", time.Second, nil)
	fmt.Println(l.Refresh(ctx, 300*time.Millisecond)) // held: its TTL is now 300ms
	time.Sleep(600 * time.Millisecond)                // past the 300ms TTL: an example shows expiry by waiting it out
	fmt.Println(errors.Is(l.Refresh(ctx, time.Second), lock.ErrNotHeld))
	_, err := lock.New(rdb).Obtain(ctx, "", time.Second, nil)
	fmt.Println(errors.Is(err, lock.ErrInvalid), errors.Is(err, lock.ErrUnavailable))
	// Output:
	// <nil>
	// true
	// true false
}
