package lock_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/lock"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestReleaseAndRefreshNeedTheToken(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	lc := lock.New(c)
	key := c.Prefix + ":{k}:lock"

	l, err := lc.Obtain(ctx, key, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 50*time.Millisecond {
		t.Fatalf("PTTL = %v", ttl)
	}
	if err := c.Del(ctx, key).Err(); err != nil { // expired: the key is gone, as its TTL would make it
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("refresh after expiry: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release after expiry: %v", err)
	}

	other, err := lc.Obtain(ctx, key, time.Minute, nil) // taken by another
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release of another's lock: %v", err)
	}
	if err := l.Refresh(ctx, time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("refresh of another's lock: %v", err)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl < 50*time.Second {
		t.Fatalf("the other holder's lock was touched: PTTL %v", ttl)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("released lock still exists")
	}
	if len(other.Token()) != 32 || other.Token() == l.Token() {
		t.Fatalf("tokens %q %q", l.Token(), other.Token())
	}
}

func TestWaitAndContext(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	lc := lock.New(c)
	key := c.Prefix + ":{k}:lock"
	holder, err := lc.Obtain(ctx, key, 100*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Waiting long enough: obtained once the holder's lock expires.
	l, err := lc.Obtain(ctx, key, time.Second, &lock.Options{Wait: 2 * time.Second})
	if err != nil {
		t.Fatalf("waiting obtain: %v", err)
	}
	if l.Token() == holder.Token() {
		t.Fatal("the waiting obtain reused the holder's token")
	}
	// A cancelled context stops the retries.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := lc.Obtain(cctx, key, time.Second, &lock.Options{Wait: time.Minute}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if _, err := lc.Obtain(ctx, "", time.Second, nil); !errors.Is(err, lock.ErrInvalid) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := lc.Obtain(ctx, key, 0, nil); !errors.Is(err, lock.ErrInvalid) {
		t.Fatalf("zero TTL: %v", err)
	}
}

func TestWatchdogOutlivesTTL(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	lc := lock.New(c)
	key := c.Prefix + ":{k}:lock"
	const ttl = 150 * time.Millisecond
	l, err := lc.Obtain(ctx, key, ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Bool
	stop := l.KeepAlive(ctx, ttl, func(error) { lost.Store(true) })
	time.Sleep(3 * ttl) // a load three times longer than the TTL: the time is the subject
	if _, err := lc.Obtain(ctx, key, ttl, nil); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("lock lost during the watchdog: %v", err)
	}
	if got := c.Get(ctx, key).Val(); got != l.Token() {
		t.Fatalf("after 3 TTLs the key holds %q, want the holder's token", got)
	}
	stop()
	if lost.Load() {
		t.Fatal("onLost called while the lock was held")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release after 3×TTL: %v", err)
	}

	// The watchdog reports a lock taken away from it.
	l, err = lc.Obtain(ctx, key, ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	reason := make(chan error, 1)
	stop = l.KeepAlive(ctx, ttl, func(err error) { reason <- err })
	c.Del(ctx, key)
	select {
	case err := <-reason:
		if !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("onLost(%v), want ErrNotHeld", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("onLost not called after the lock vanished")
	}
	stop()
}

// TestKeepAliveShortLease: a lock taken with a lease shorter than the TTL
// the watchdog keeps it at gets its first refresh within that lease, and
// from then on holds the longer TTL.
func TestKeepAliveShortLease(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	lc := lock.New(c)
	key := c.Prefix + ":{k}:lock"
	const lease, ttl = 150 * time.Millisecond, 5 * time.Second
	l, err := lc.Obtain(ctx, key, lease, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := l.KeepAlive(ctx, ttl, func(err error) { t.Errorf("onLost(%v)", err) })
	defer stop()
	time.Sleep(3 * lease) // a load three times longer than the lease: the time is the subject
	if _, err := lc.Obtain(ctx, key, lease, nil); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("the lock expired with its first lease: %v", err)
	}
	if left := c.PTTL(ctx, key).Val(); left <= lease {
		t.Fatalf("PTTL %v, want the watchdog's %v", left, ttl)
	}
}

// TestKeepAliveShortHold: a hold that ends before the first refresh is due
// sends nothing and starts no goroutine (TestMain's leak check would see one
// left behind); a stop after ctx ended returns at once.
func TestKeepAliveShortHold(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	lc := lock.New(c)
	key := c.Prefix + ":{k}:lock"
	l, err := lc.Obtain(ctx, key, 30*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := c.Counter.Commands()
	goroutines := runtime.NumGoroutine()
	stop := l.KeepAlive(ctx, 30*time.Second, func(err error) { t.Errorf("onLost(%v)", err) })
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Errorf("KeepAlive started %d goroutines before a refresh was due", n-goroutines)
	}
	stop()
	stop() // twice is fine
	if n := c.Counter.Commands() - before; n != 0 {
		t.Errorf("a hold shorter than ttl/3 sent %d commands", n)
	}

	// ctx ends while the watchdog runs: it stops, and stop returns.
	cctx, cancel := context.WithCancel(ctx)
	stop = l.KeepAlive(cctx, 30*time.Millisecond, nil)
	time.Sleep(50 * time.Millisecond) // a refresh or two (the watchdog's goroutine starts with its first): nothing tells when
	cancel()
	stop()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// TestQueue: a plain SET NX PX in the caller's pipeline, one command; the
// commands queued after it see the lock; a second attempt is not obtained;
// the lock is released and refreshed by its token.
func TestQueue(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	lc := lock.New(c)
	key := c.Prefix + ":{k}:lock"
	pipe := c.Pipeline()
	q, err := lc.Queue(ctx, pipe, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if n := pipe.Len(); n != 1 {
		t.Fatalf("Queue queued %d commands, want 1", n)
	}
	after := pipe.Get(ctx, key)
	_, _ = pipe.Exec(ctx)
	l, err := q.Result(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Val() != l.Token() {
		t.Fatalf("queued after the attempt saw %q, want the token %q", after.Val(), l.Token())
	}
	pipe = c.Pipeline()
	q2, _ := lc.Queue(ctx, pipe, key, time.Minute)
	_, _ = pipe.Exec(ctx)
	if _, err := q2.Result(ctx); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("second attempt: %v", err)
	}
	if err := l.Refresh(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl <= time.Minute {
		t.Fatalf("after Refresh: PTTL %v", ttl)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second release: %v", err)
	}
	for _, bad := range []struct {
		key string
		ttl time.Duration
	}{{"", time.Second}, {key, 0}} {
		if _, err := lc.Queue(ctx, c.Pipeline(), bad.key, bad.ttl); !errors.Is(err, lock.ErrInvalid) {
			t.Fatalf("Queue(%q, %v): %v", bad.key, bad.ttl, err)
		}
	}
}

// TestRedisDownIsErrUnavailable: every operation that needs Redis reports a
// dead server with an error wrapping ErrUnavailable.
func TestRedisDownIsErrUnavailable(t *testing.T) {
	ctx := context.Background()
	srv, rdb := redistest.Private(t)
	lc := lock.New(rdb)
	l, err := lc.Obtain(ctx, "{k}:lock", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	ops := map[string]func() error{
		"Obtain":  func() error { _, err := lc.Obtain(ctx, "{j}:lock", time.Second, nil); return err },
		"Release": func() error { return l.Release(ctx) },
		"Refresh": func() error { return l.Refresh(ctx, time.Second) },
		"Queue": func() error {
			pipe := rdb.Pipeline()
			q, err := lc.Queue(ctx, pipe, "{j}:lock", time.Second)
			if err != nil {
				return err
			}
			_, _ = pipe.Exec(ctx)
			_, err = q.Result(ctx)
			return err
		},
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrNotHeld) || errors.Is(err, lock.ErrNotObtained) {
			t.Errorf("%s with Redis down: %v, want ErrUnavailable", name, err)
		}
	}
}
