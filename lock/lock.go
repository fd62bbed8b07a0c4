// Package lock is a fenced Redis lock with a watchdog, usable without the
// rest of cacheguard. It guarantees:
//   - one holder at a time per key while the lock lives: [Client.Obtain]
//     sets a token unique to the attempt (SET NX PX), retrying as [Options]
//     say; [Client.Queue] queues one attempt in the caller's pipeline;
//   - only the holder frees or extends it: [Lock.Release] and [Lock.Refresh]
//     check the token in a script, else return [ErrNotHeld];
//   - [Lock.KeepAlive] renews it while the holder works, and says if lost.
//
// An expired lock protects nothing (a paused process): fence the work by
// checking [Lock.Token] in the holder's write script, as the example does.
// Hash-tag the key to keep it on a cluster beside what it guards. Redis
// failures wrap [ErrUnavailable].
package lock

import (
	"context"
	cryptorand "crypto/rand"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/backoff"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

var (
	// ErrNotObtained: another holder has the lock (and Options.Wait ran out).
	ErrNotObtained = errors.New("lock: not obtained")
	// ErrNotHeld: the lock expired or belongs to another holder.
	ErrNotHeld = errors.New("lock: not held")
	// ErrInvalid reports a bad key, TTL or option.
	ErrInvalid = errors.New("lock: invalid argument")
	// ErrUnavailable is wrapped by every error that Redis failing to
	// answer causes (the value of guard.ErrUnavailable and
	// bloom.ErrUnavailable).
	ErrUnavailable = redisfail.ErrUnavailable
)

var (
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/refresh.lua
	refreshLua string

	releaseScript = redis.NewScript(releaseLua)
	refreshScript = redis.NewScript(refreshLua)
)

// Client obtains locks. It is safe for concurrent use.
type Client struct {
	rdb redis.UniversalClient
}

// New returns a Client on rdb (standalone, Sentinel or Cluster).
func New(rdb redis.UniversalClient) *Client { return &Client{rdb: rdb} }

// Options tunes Obtain. A nil *Options means defaults: one attempt.
type Options struct {
	// Wait is how long Obtain keeps trying while another holder has the
	// lock. 0: a single attempt. Retries stop early when ctx is done.
	Wait time.Duration
	// MinBackoff and MaxBackoff bound the pause between attempts; it starts
	// at MinBackoff (default 4ms) and doubles up to MaxBackoff (default
	// 256ms), with full jitter, and never outlasts the holder's remaining TTL.
	MinBackoff, MaxBackoff time.Duration
}

// heldError is the error Obtain returns when another holder keeps the lock:
// it wraps ErrNotObtained and tells how long the holder's lock had left at
// the last attempt (0 after Queue, which does not ask), which bounds
// Obtain's next pause.
type heldError struct {
	ttl time.Duration
}

func (e *heldError) Error() string {
	if e.ttl <= 0 {
		return ErrNotObtained.Error()
	}
	return fmt.Sprintf("%v (held by another for %v more)", ErrNotObtained, e.ttl)
}

// Unwrap makes errors.Is(err, ErrNotObtained) true.
func (e *heldError) Unwrap() error { return ErrNotObtained }

// Lock is an obtained lock.
type Lock struct {
	c     *Client
	key   string
	token string
	lease time.Duration // the TTL it was taken with (KeepAlive's first refresh is due a third of the way in)
}

// Obtain takes the lock key for ttl, retrying as opts says. It returns
// an error wrapping ErrNotObtained when another holder keeps it (it says
// how long that holder's lock had left); Redis errors wrap ErrUnavailable.
func (c *Client) Obtain(ctx context.Context, key string, ttl time.Duration, opts *Options) (*Lock, error) {
	o, err := resolve(key, ttl, opts)
	if err != nil {
		return nil, err
	}
	token, err := newToken()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(o.Wait)
	pause := backoff.New(o.MinBackoff, o.MaxBackoff, true)
	for {
		pipe := c.rdb.Pipeline()
		q := c.queue(ctx, pipe, key, ttl, token, true)
		_, _ = pipe.Exec(ctx) // errors are read per command
		l, err := q.Result(ctx)
		var held *heldError
		if !errors.As(err, &held) {
			return l, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, held
		}
		bound := left // and never past the holder's remaining lease
		if held.ttl > 0 {
			bound = min(bound, held.ttl)
		}
		if err := pause.Wait(ctx, bound, nil); err != nil {
			return nil, err
		}
	}
}

func resolve(key string, ttl time.Duration, opts *Options) (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if key == "" {
		return o, fmt.Errorf("%w: empty key", ErrInvalid)
	}
	if ttl < time.Millisecond {
		return o, fmt.Errorf("%w: TTL %v below 1ms", ErrInvalid, ttl)
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 4 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(256*time.Millisecond, o.MinBackoff)
	}
	return o, nil
}

// Queued is one attempt to obtain a lock, queued in a pipeline.
type Queued struct {
	c          *Client
	key, token string
	ttl        time.Duration
	set        *redis.BoolCmd     // SET NX PX
	pttl       *redis.DurationCmd // and the lock's PTTL behind it (Obtain's; nil after Queue)
}

// Queue adds one attempt to obtain key to pipe: SET key token NX PX ttl.
// Redis runs a connection's commands in order, so a read of the same slot
// queued behind it is, for the winner, the re-check of what the lock guards,
// in the same round trip. Read the outcome with Result after the pipeline ran.
func (c *Client) Queue(ctx context.Context, pipe redis.Pipeliner, key string, ttl time.Duration) (*Queued, error) {
	if _, err := resolve(key, ttl, nil); err != nil {
		return nil, err
	}
	token, err := newToken()
	if err != nil {
		return nil, err
	}
	return c.queue(ctx, pipe, key, ttl, token, false), nil
}

func (c *Client) queue(ctx context.Context, pipe redis.Pipeliner, key string, ttl time.Duration, token string, withTTL bool) *Queued {
	q := &Queued{c: c, key: key, token: token, ttl: ttl}
	q.set = pipe.SetNX(ctx, key, token, ttl)
	if withTTL {
		q.pttl = pipe.PTTL(ctx, key)
	}
	return q
}

// Result returns the lock, an error wrapping ErrNotObtained (another holder
// has it), or a Redis error wrapping ErrUnavailable.
func (q *Queued) Result(context.Context) (*Lock, error) {
	got, err := q.set.Result()
	if err != nil {
		return nil, fmt.Errorf("lock: obtain %s: %w", q.key, redisfail.Wrap(err))
	}
	if !got {
		var left time.Duration // -2: the holder's lock expired between the two commands
		if q.pttl != nil {
			left = max(q.pttl.Val(), 0)
		}
		return nil, &heldError{ttl: left}
	}
	return &Lock{c: q.c, key: q.key, token: q.token, lease: q.ttl}, nil
}

// Tokens are a random 64-bit prefix drawn once per process (crypto/rand)
// followed by a 64-bit count of the tokens it handed out: unique across
// processes and restarts, without a crypto/rand read per lock. They need
// not be unguessable: a client that can reach the lock key can delete it.
var tokens struct {
	once   sync.Once
	prefix [8]byte
	err    error
	n      atomic.Uint64
}

func newToken() (string, error) {
	tokens.once.Do(func() { _, tokens.err = cryptorand.Read(tokens.prefix[:]) })
	if tokens.err != nil {
		return "", fmt.Errorf("lock: token: %w", tokens.err)
	}
	var b [16]byte
	copy(b[:8], tokens.prefix[:])
	binary.BigEndian.PutUint64(b[8:], tokens.n.Add(1))
	return hex.EncodeToString(b[:]), nil
}

// Token returns the lock's token: unique to this lock (see newToken), and
// what the lock key holds while the lock is this one. A write that must not
// land once the lock has expired compares it with the lock key in the same
// script (the fence).
func (l *Lock) Token() string { return l.token }

// Release frees the lock. ErrNotHeld if it had expired or was taken over.
func (l *Lock) Release(ctx context.Context) error { return l.run(ctx, "release", releaseScript) }

// Refresh sets the lock's TTL to ttl. ErrNotHeld if it had expired or was
// taken over.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: TTL %v below 1ms", ErrInvalid, ttl)
	}
	return l.run(ctx, "refresh", refreshScript, ttl.Milliseconds())
}

// run runs script, which acts only if the lock key holds the lock's token.
func (l *Lock) run(ctx context.Context, op string, script *redis.Script, args ...any) error {
	n, err := script.Run(ctx, l.c.rdb, []string{l.key}, append([]any{l.token}, args...)...).Int64()
	if err != nil {
		return fmt.Errorf("lock: %s %s: %w", op, l.key, redisfail.Wrap(err))
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}

// KeepAlive starts a watchdog that refreshes the lock to ttl every ttl/3
// until stop is called or ctx is done; its goroutine, started only when the
// first refresh is due, ends by the time stop returns. If a refresh finds
// the lock gone, or refreshes fail until it must have expired, it calls
// onLost once (if non-nil) and stops. docs/design.md (The lock package) has the details.
func (l *Lock) KeepAlive(ctx context.Context, ttl time.Duration, onLost func(error)) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	period := max(ttl/3, time.Millisecond)
	lastOK := time.Now() // the lock was taken (or last refreshed) with held about now
	held, first := ttl, period
	if l.lease > 0 && l.lease < ttl {
		held, first = l.lease, max(l.lease/3, time.Millisecond)
	}
	t := time.AfterFunc(first, func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			default:
			}
			err := l.Refresh(ctx, ttl)
			switch {
			case err == nil:
				lastOK, held = time.Now(), ttl
			case errors.Is(err, ErrNotHeld), time.Since(lastOK) >= held:
				// gone, or failing for so long that it must have expired
				if onLost != nil {
					onLost(err)
				}
				return
			}
			// else a passing Redis error: the lock still stands
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			if t.Stop() { // the watchdog never started, and now never will
				close(done)
			}
		})
		<-done
	}
}
