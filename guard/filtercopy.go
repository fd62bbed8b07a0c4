package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cacheguard/cacheguard/internal/backoff"
)

// The filter's copy in process memory (bloom.Filter.RefreshCopy): while the
// filter is not ready or Redis cannot answer, an ID the copy has never seen
// is answered ErrUnconfirmed, neither loaded nor ErrNotFound (another
// process may have added it since the copy). A Guard that holds no copy, or
// with Filter.NoLocalCopy, fails open as before. docs/operations.md.

// A refresh runs every copyEvery, or less often for a filter so large that
// fetching it then would average more than copyRate bytes a second.
const (
	copyEvery = time.Minute
	copyRate  = 100 << 10
	copyFresh = 5 * time.Second
)

// keepCopy starts the goroutine that keeps the copy: fetched at once, again
// at each interval, after a Rebuild here, when a probe finds the filter not
// ready (a rebuild may follow), and every retryMax at most while a refresh
// fails and a copy is held (an incident: the filter may be back).
func (g *Guard) keepCopy() {
	if g.opts.Filter.NoLocalCopy {
		return
	}
	g.sup.goLoop(func(ctx context.Context) {
		gap := backoff.New(retryMin, retryMax, true)
		force := false // the first turn, and a retry, skip a copy Rebuild just fetched
		for {
			size, err := g.refreshHeld(ctx, force)
			if err == nil {
				gap = backoff.New(retryMin, retryMax, true)
			}
			if gap.Wait(ctx, 0, nil) != nil {
				return
			}
			if force = true; err != nil && g.copyHeld() {
				force = false
				continue
			}
			every := max(copyEvery, time.Duration(size/copyRate)*time.Second)
			if backoff.New(every, every, false).Wait(ctx, 0, g.bf.copyWake) != nil {
				return
			}
		}
	})
}

// refreshCopy is one refresh of the copy (see keepCopy): its size in bytes.
func (g *Guard) refreshCopy(ctx context.Context) (int, error) {
	f := g.bf.f.Load()
	switch {
	case g.opts.Filter.NoLocalCopy:
		return 0, errors.New("cacheguard: Filter.NoLocalCopy: no copy")
	case f == nil:
		return 0, errors.New("cacheguard: filter not opened yet")
	}
	return f.RefreshCopy(ctx)
}

// refreshHeld is refreshCopy under copyHold, unless (without force) one landed
// less than copyFresh ago (Rebuild's: the loop's first turn or retry need not
// fetch it again).
func (g *Guard) refreshHeld(ctx context.Context, force bool) (int, error) {
	g.bf.copyHold.Lock()
	defer g.bf.copyHold.Unlock()
	if !force && time.Since(g.bf.copyAt) < copyFresh {
		return g.copyBytes(), nil
	}
	n, err := g.refreshCopy(ctx)
	if err == nil {
		g.bf.copyAt = time.Now()
	}
	return n, err
}

// wakeCopy cuts the copy's wait short: the filter may have a new generation.
func (g *Guard) wakeCopy() {
	select {
	case g.bf.copyWake <- struct{}{}:
	default:
	}
}

func (g *Guard) copyHeld() bool { return g.copyBytes() != 0 }

// copyBytes is the size of the copy held (0: none).
func (g *Guard) copyBytes() int {
	if f := g.bf.f.Load(); f != nil {
		_, n := f.CopyInfo()
		return n
	}
	return 0
}

// copySaysAbsent reports whether the copy has never seen id (false when
// there is no copy).
func (g *Guard) copySaysAbsent(id string) bool {
	f := g.bf.f.Load()
	if f == nil {
		return false
	}
	maybe, ok := f.TestCopy(id)
	return ok && !maybe
}

// absentInCopy is the answer for id while Redis or its filter cannot say
// (cause: the Redis failure, nil for a filter not ready): ErrUnconfirmed
// when the copy has never seen id; nil when it has, or there is no copy
// (the caller then fails open as before).
func (g *Guard) absentInCopy(ctx context.Context, id string, cause error) error {
	if !g.copySaysAbsent(id) {
		return nil
	}
	return g.unconfirmed(ctx, id, cause)
}

// unconfirmed counts an ErrUnconfirmed answer for id and returns it.
func (g *Guard) unconfirmed(ctx context.Context, id string, cause error) error {
	g.stats.unconfirmed.Add(1)
	g.log.WarnContext(ctx, "cacheguard: redis or its bloom filter cannot answer; IDs this process's copy of the filter "+
		"has not seen answer ErrUnconfirmed (503), the others load through", "id", id, "err", cause)
	err := fmt.Errorf("cacheguard: %s %q: %w", g.name, id, ErrUnconfirmed)
	if cause != nil {
		return fmt.Errorf("%w (%w)", err, cause)
	}
	return err
}

// absentManyInCopy is absentInCopy for GetMany's IDs: the IDs to load
// through, and the errors of the others joined.
func (g *Guard) absentManyInCopy(ctx context.Context, ids []string, cause error) ([]string, error) {
	var rest []string
	var errs []error
	for _, id := range ids {
		if err := g.absentInCopy(ctx, id, cause); err != nil {
			g.answeredMany(ctx, outFailed, false, false)
			errs = append(errs, err)
			continue
		}
		rest = append(rest, id)
	}
	return rest, errors.Join(errs...)
}
