package loader_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/loader"
	"github.com/cacheguard/cacheguard/lock"
)

// filler answers from any cached bytes and loads with load.
func filler(load func(ctx context.Context) ([]byte, time.Duration, error)) loader.Fill {
	return loader.Fill{Accept: func(context.Context, []byte, time.Duration) bool { return true }, Load: load}
}

// newCoordinator connects to the test's Redis and opens a Coordinator on
// the channel <prefix>:ch, closed when the test ends.
func newCoordinator(t *testing.T) (*redistest.Conn, *loader.Coordinator) {
	t.Helper()
	c := redistest.Connect(t)
	co := loader.NewCoordinator(c.UniversalClient, c.Prefix+":ch", nil)
	t.Cleanup(func() { _ = co.Close() })
	return c, co
}

// written checks that key holds the test loads' frame "v" under field "1"
// and that its lock was released.
func written(t *testing.T, c *redistest.Conn, key string) {
	t.Helper()
	ctx := context.Background()
	if v := c.HGet(ctx, key, "1").Val(); v != "v" {
		t.Fatalf("cached %q, want the load's frame", v)
	}
	if n := c.Exists(ctx, keyspace.Lock(key)).Val(); n != 0 {
		t.Fatal("lock left behind")
	}
}

// TestCoordinatorOneLoadManyCoordinators: several Coordinators (as in several
// processes) fill one key; the load runs once, its write lands, and the rest
// wake on the publish and read it.
func TestCoordinatorOneLoadManyCoordinators(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	key := c.Prefix + ":{k}"
	var loads, wakeups atomic.Int32
	f := filler(func(ctx context.Context) ([]byte, time.Duration, error) {
		loads.Add(1)
		// Until a waiter has subscribed and left its mark: then the publish
		// must wake it, however slow the machine (a fixed sleep could end
		// before any waiter subscribed).
		if !poll(func() bool { return c.Exists(ctx, keyspace.Waiting(key)).Val() == 1 }) {
			return nil, 0, errors.New("no waiter left its mark in 10s")
		}
		return []byte("v"), time.Minute, nil
	})
	var wg sync.WaitGroup
	for range 8 {
		co := loader.NewCoordinator(redistest.Connect(t).UniversalClient, c.Prefix+":ch", nil)
		defer co.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := co.Run(ctx, key, "1", nil, f); err != nil {
				t.Error(err)
			}
			wakeups.Add(int32(co.Stats().Wakeups))
		}()
	}
	wg.Wait()
	if loads.Load() != 1 {
		t.Fatalf("%d loads, want 1", loads.Load())
	}
	if wakeups.Load() == 0 {
		t.Fatal("no waiter was woken by the publish")
	}
	written(t, c, key)
}

func TestCoordinatorReleasesOnPanicAndError(t *testing.T) {
	ctx := context.Background()
	c, co := newCoordinator(t)
	key := c.Prefix + ":{k}"
	ps := c.Subscribe(ctx, c.Prefix+":ch")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	c.Set(ctx, keyspace.Waiting(key), "1", time.Minute) // as a flight elsewhere waits
	func() {
		defer func() { _ = recover() }()
		_, _ = co.Run(ctx, key, "1", nil, filler(func(context.Context) ([]byte, time.Duration, error) { panic("boom") }))
	}()
	if pttl := c.PTTL(ctx, keyspace.Lock(key)).Val(); pttl != -2 {
		t.Fatalf("after a panic the lock has PTTL %v, want -2", pttl)
	}
	if msg, err := ps.ReceiveMessage(ctx); err != nil || msg.Payload != key {
		t.Fatalf("after a panic waiters were not told: %v, %v", msg, err)
	}
	boom := errors.New("db down")
	if _, err := co.Run(ctx, key, "1", nil, filler(func(context.Context) ([]byte, time.Duration, error) { return nil, 0, boom })); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if n := c.Exists(ctx, keyspace.Lock(key), key).Val(); n != 0 {
		t.Fatal("lock or value left behind after an error")
	}
	// An invalidation (the lock deleted) during the load refuses the
	// write: Run loads again under a new lock, with a new token.
	var tokens []string
	_, err := co.Run(ctx, key, "1", nil, filler(func(ctx context.Context) ([]byte, time.Duration, error) {
		tokens = append(tokens, c.Get(ctx, keyspace.Lock(key)).Val())
		if len(tokens) < 3 {
			c.Del(ctx, keyspace.Lock(key))
		}
		return []byte("v"), time.Minute, nil
	}))
	if err != nil || len(tokens) != 3 || tokens[0] == "" || tokens[0] == tokens[1] || tokens[1] == tokens[2] || tokens[0] == tokens[2] {
		t.Fatalf("err %v, tokens %v", err, tokens)
	}
	if st := co.Stats(); st.StaleWrites != 2 {
		t.Fatalf("stale writes %d, want 2", st.StaleWrites)
	}
	if v := c.HGet(ctx, key, "1").Val(); v != "v" {
		t.Fatalf("cached %q after the third load", v)
	}
	if err := co.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCoordinatorPublishesOnlyWhenAwaited: a load nobody waited for
// publishes nothing (every process that ever waited would read the
// message); a waiter in another process leaves the waiting mark, and the
// holder's write wakes it with a publish and clears the mark.
func TestCoordinatorPublishesOnlyWhenAwaited(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := redistest.Connect(t)
	channel := c.Prefix + ":ch"
	ps := c.Subscribe(ctx, channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// next is the payload of the next message on the channel: a publish
	// that happened before the sentinel's comes first.
	next := func() string {
		t.Helper()
		if err := c.Publish(ctx, channel, "sentinel").Err(); err != nil {
			t.Fatal(err)
		}
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Payload != "sentinel" { // drain the sentinel behind it
			if m, err := ps.ReceiveMessage(ctx); err != nil || m.Payload != "sentinel" {
				t.Fatalf("after %q: %v, %v", msg.Payload, m, err)
			}
		}
		return msg.Payload
	}
	holder := loader.NewCoordinator(c.UniversalClient, channel, nil)
	defer holder.Close()
	key := c.Prefix + ":{k}"
	value := filler(func(context.Context) ([]byte, time.Duration, error) { return []byte("v"), time.Minute, nil })
	if _, err := holder.Run(ctx, key, "1", nil, value); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "sentinel" {
		t.Fatalf("a load nobody waited for published %q", got)
	}
	failing := filler(func(context.Context) ([]byte, time.Duration, error) { return nil, 0, errors.New("db down") })
	if _, err := holder.Run(ctx, c.Prefix+":{gone}", "1", nil, failing); err == nil {
		t.Fatal("the failing load's error was lost")
	}
	if got := next(); got != "sentinel" {
		t.Fatalf("a failed load nobody waited for published %q", got)
	}

	// A waiter in another process: the holder's load runs until the
	// waiter's mark is there.
	key = c.Prefix + ":{w}"
	marked := make(chan struct{})
	slow := filler(func(ctx context.Context) ([]byte, time.Duration, error) {
		<-marked
		return []byte("w"), time.Minute, nil
	})
	holding := make(chan error, 1)
	go func() { holding <- errOf(holder.Run(ctx, key, "1", nil, slow)) }()
	until(t, func() bool { return c.Exists(ctx, keyspace.Lock(key)).Val() == 1 }) // the holder's lock attempt
	waiter := loader.NewCoordinator(redistest.Connect(t).UniversalClient, channel, nil)
	defer waiter.Close()
	waiting := make(chan error, 1)
	var got []byte
	go func() {
		waiting <- errOf(waiter.Run(ctx, key, "1", nil, cachedInto(&got)))
	}()
	until(t, func() bool { return c.Exists(ctx, keyspace.Waiting(key)).Val() == 1 })
	close(marked)
	if err := <-holding; err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
	if string(got) != "w" {
		t.Fatalf("the waiter read %q", got)
	}
	if st := waiter.Stats(); st.Waits != 1 || st.Wakeups != 1 {
		t.Fatalf("waiter stats %+v: want one wait, ended by the publish", st)
	}
	if got := next(); got != key {
		t.Fatalf("the awaited load published %q, want %q", got, key)
	}
	if n := c.Exists(ctx, keyspace.Waiting(key)).Val(); n != 0 {
		t.Fatal("the waiting mark outlived the publish")
	}
}

// cachedInto is a Fill that keeps what the cache answered in got and never loads.
func cachedInto(got *[]byte) loader.Fill {
	return loader.Fill{
		Accept: func(_ context.Context, raw []byte, _ time.Duration) bool {
			*got = append([]byte(nil), raw...)
			return true
		},
		Load: func(context.Context) ([]byte, time.Duration, error) { return nil, 0, errors.New("the waiter loaded") },
	}
}

// TestCoordinatorTakenOverWriteKeepsTheNewLock: a holder whose lock expired
// and passed to another holder during its load has its write refused, and
// leaves the new holder's lock alone (write_release writes and deletes the
// lock only while it holds the writer's token).
func TestCoordinatorTakenOverWriteKeepsTheNewLock(t *testing.T) {
	ctx := context.Background()
	c, co := newCoordinator(t)
	key := c.Prefix + ":{k}"
	lc := lock.New(c)
	var other *lock.Lock
	_, err := co.TryRun(ctx, key, "1", filler(func(ctx context.Context) ([]byte, time.Duration, error) {
		c.Del(ctx, keyspace.Lock(key)) // the lease ran out...
		var err error                  // ...and another process took the lock
		other, err = lc.Obtain(ctx, keyspace.Lock(key), time.Minute, nil)
		if err != nil {
			t.Error(err)
		}
		return []byte("stale"), time.Minute, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("the overtaken holder's write landed")
	}
	if got := c.Get(ctx, keyspace.Lock(key)).Val(); other == nil || got != other.Token() {
		t.Fatalf("lock holds %q after the overtaken holder's release, want the new holder's token", got)
	}
	if st := co.Stats(); st.StaleWrites != 1 {
		t.Fatalf("stale writes %d, want 1", st.StaleWrites)
	}
}

// holdPipelines is a redis.Hook that holds the first n pipelines until
// release is closed.
type holdPipelines struct {
	n       atomic.Int32
	held    chan struct{} // closed when n pipelines are held
	release chan struct{}
}

func (h *holdPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *holdPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		switch h.n.Add(-1) {
		case 0:
			close(h.held)
			fallthrough
		case 1:
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// TestCoordinatorFlightsShareRoundTrips: while two flights' lock attempts
// are under way, the attempts of twenty more flights (twenty keys) wait and
// go in one round trip; every flight still loads and writes its own key
// once, and leaves no lock.
func TestCoordinatorFlightsShareRoundTrips(t *testing.T) {
	root := redistest.GoID() // the flights below are its goroutines
	ctx := context.Background()
	c, co := newCoordinator(t)
	one := filler(func(context.Context) ([]byte, time.Duration, error) { return []byte("v"), time.Minute, nil })
	key := func(i int) string { return c.Prefix + ":{k" + string(rune('a'+i)) + "}" }
	for i := range 22 { // loads the scripts on every node of a cluster: no NOSCRIPT below
		if _, err := co.Run(ctx, key(i)+":warm", "1", nil, one); err != nil {
			t.Fatal(err)
		}
	}
	h := &holdPipelines{held: make(chan struct{}), release: make(chan struct{})}
	h.n.Store(2)
	c.AddHook(h)
	c.Counter.Reset()
	var loads atomic.Int32
	f := filler(func(context.Context) ([]byte, time.Duration, error) {
		loads.Add(1)
		return []byte("v"), time.Minute, nil
	})
	var wg sync.WaitGroup
	run := func(i int) {
		wg.Go(func() {
			if _, err := co.Run(ctx, key(i), "1", nil, f); err != nil {
				t.Error(err)
			}
		})
	}
	run(0)
	run(1)
	<-h.held
	for i := 2; i < 22; i++ {
		run(i)
	}
	// 20 round trips wait to be sent (see runTrips) behind the held one
	// (which runs alone, in its caller's goroutine: not waiting in await).
	until(t, func() bool {
		return redistest.Parked(root, "batch.(*Batcher[...]).await", "loader.(*Coordinator)") == 20
	})
	close(h.release)
	wg.Wait()
	names := c.Counter.Names()
	trips, attempts, scripts := c.Counter.RoundTrips(), names["set"], names["evalsha"]
	if loads.Load() != 22 {
		t.Fatalf("%d loads, want one per key, 22", loads.Load())
	}
	for i := range 22 {
		if v := c.HGet(ctx, key(i), "1").Val(); v != "v" {
			t.Fatalf("key %d cached %q", i, v)
		}
		if n := c.Exists(ctx, keyspace.Lock(key(i))).Val(); n != 0 {
			t.Fatalf("key %d: lock left behind", i)
		}
	}
	t.Logf("22 flights: %d lock attempts and %d write scripts in %d round trips", attempts, scripts, trips)
	// Alone: 22 lock attempts + 22 writes = 44 round trips. Shared: the two
	// held, one for the twenty that waited (one per node on a cluster, at
	// most 3 here), then at most 22 for the writes.
	if attempts != 22 || scripts != 22 || trips > 2+3+22 {
		t.Fatalf("%d lock attempts and %d write scripts in %d round trips", attempts, scripts, trips)
	}
}

// TestRunHeld: a caller that took the lock in its own round trip, with the
// re-check behind it, loads once under that lock; another Coordinator
// waiting for the lock meanwhile reads what it wrote. A lock taken and not
// needed is given back with Release, which wakes a waiter.
func TestRunHeld(t *testing.T) {
	ctx := context.Background()
	c, co := newCoordinator(t)
	other := loader.NewCoordinator(redistest.Connect(t).UniversalClient, c.Prefix+":ch", nil)
	defer other.Close()
	lc := lock.New(c)
	take := func(key string) *lock.Lock {
		t.Helper()
		pipe := c.Pipeline()
		q, err := lc.Queue(ctx, pipe, keyspace.Lock(key), 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		get := pipe.HGet(ctx, key, "1")
		_, _ = pipe.Exec(ctx)
		l, err := q.Result(ctx)
		if err != nil || !errors.Is(get.Err(), redis.Nil) {
			t.Fatalf("lock %v, re-check %v: want the lock and nothing cached", err, get.Err())
		}
		return l
	}
	var loads atomic.Int32
	loaded := make(chan struct{})
	var key string
	f := filler(func(ctx context.Context) ([]byte, time.Duration, error) {
		if loads.Add(1) == 1 {
			close(loaded)
			// Until the other has subscribed and left its mark: the publish
			// must then wake it (the load runs in the test's goroutine).
			until(t, func() bool { return c.Exists(ctx, keyspace.Waiting(key)).Val() == 1 })
		}
		return []byte("v"), time.Minute, nil
	})

	key = c.Prefix + ":{held}"
	l := take(key)
	waited := make(chan error, 1)
	go func() {
		<-loaded
		waited <- errOf(other.Run(ctx, key, "1", nil, f)) // finds the lock held: waits, then reads
	}()
	if _, err := co.Run(ctx, key, "1", l, f); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if n := loads.Load(); n != 1 {
		t.Fatalf("%d loads, want 1", n)
	}
	written(t, c, key)

	// A lock taken and not needed: Release frees it and wakes the waiter,
	// which then loads under a lock of its own.
	key = c.Prefix + ":{unused}"
	l = take(key)
	waited = make(chan error, 1)
	go func() { waited <- errOf(other.Run(ctx, key, "1", nil, f)) }()
	until(t, func() bool { return c.Exists(ctx, keyspace.Waiting(key)).Val() == 1 }) // subscribed and marked: a publish reaches it
	if err := co.Release(ctx, l, key); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if n, w := loads.Load(), other.Stats().Wakeups; n != 2 || w != 2 {
		t.Fatalf("%d loads and %d wake-ups, want 2 and 2 (one per wait)", n, w)
	}
	if err := co.Release(ctx, l, key); err != nil { // no longer l's: left alone
		t.Fatal(err)
	}
}

// TestWaitSeesALockReleasedUnwritten: a holder that releases the lock
// without writing (a failed load, a read's lock given back) before a
// waiter leaves its mark publishes to nobody; the waiter sees the lock gone
// behind its mark and attempts again at once instead of waiting out the
// holder's lease.
func TestWaitSeesALockReleasedUnwritten(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	co := loader.NewCoordinator(c.UniversalClient, c.Prefix+":ch", nil)
	defer co.Close()
	key := c.Prefix + ":{gone}"
	l, err := lock.New(c).Obtain(ctx, keyspace.Lock(key), time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	var loads atomic.Int32
	f := filler(func(context.Context) ([]byte, time.Duration, error) {
		loads.Add(1)
		return []byte("v"), time.Minute, nil
	})
	f.Waiting = func() { // gives back the lock the moment Run starts waiting, before the wait leaves its mark
		if err := l.Release(ctx); err != nil {
			t.Error(err)
		}
	}
	ran, err := co.Run(ctx, key, "1", nil, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(ran.Waits) != 1 || ran.Waits[0].Result != "woken" {
		t.Fatalf("the waits were %+v, want one, woken (the lock was gone behind the mark)", ran.Waits)
	}
	if n, st := loads.Load(), co.Stats(); n != 1 || st.Waits != 1 {
		t.Fatalf("%d loads, %+v: want one load after one wait", n, st)
	}
}

// until waits for state the Coordinator sends no word of (a key in Redis,
// a count of waiting round trips), for 10 s.
func until(t *testing.T, cond func() bool) {
	t.Helper()
	redistest.Eventually(t, 10*time.Second, "state", cond)
}

// poll is until for a goroutine other than the test's: it reports whether
// cond held within 10 s.
func poll(cond func() bool) bool { return redistest.Poll(10*time.Second, cond) }

// errOf is a Run's error alone, for a channel of errors.
func errOf(_ loader.Ran, err error) error { return err }
