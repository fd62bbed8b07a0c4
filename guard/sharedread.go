package guard

import (
	"context"

	"github.com/cacheguard/cacheguard/loader"
)

// The shared read: a key's concurrent callers in this process share one
// Redis read, and a read that started before a caller answers it only if no
// write was heard in between (with Local); otherwise the caller reads again.
// A lock the read took stays with the caller whose read it was.

// readGroup runs the shared reads (reader.shared), one per value key at a time.
type readGroup = loader.Group[string, sharedRead]

// sharedRead is one read shared by the callers of a value key (readShared).
type sharedRead struct {
	r       readResult
	started uint64 // its number from Guard.starts, before the read (see since)
	epoch   uint64 // the local cache's epoch then
}

// readShared is read for a Guard with a local cache: when a hot key's copy
// expires, its callers in this process share one Redis read instead of
// sending one each, under the rule of join: a read that started before the
// caller serves it only if no write was heard in between (the window of a
// local copy); otherwise the caller reads again. Without a local cache
// only a read that started after the caller serves it: fill uses it so
// for the callers that waited for a flight older than them. The first
// caller reads in its own goroutine, on its own ctx, as a Get without Local
// does; each of the others leaves when its own ctx is done, and reads again
// if the first one gave up (loader.Group's InCaller). With lockable, the
// read may take the key's lock (see lockWithRead); the result carries it to
// the caller whose read it was, and to no other.
func (g *Guard) readShared(ctx context.Context, id, vkey string, from since, lockable bool) (readResult, error) {
	for range 3 { // a second read already starts after this caller: see below
		mine := false // this caller's function read (InCaller: in this goroutine)
		sr, _, err := g.rd.shared.Do(ctx, vkey, func(ctx context.Context) (sharedRead, error) {
			mine = true
			sr := sharedRead{started: g.starts.Add(1)}
			if g.local != nil {
				sr.epoch = g.local.epoch.Load()
			}
			var err error
			sr.r, err = g.read(ctx, id, vkey, lockable)
			return sr, err
		})
		if err != nil {
			return readResult{}, err
		}
		if !mine {
			// A lock the read took (see lockWithRead) is its caller's,
			// for that caller's flight; the others join the flight.
			sr.r.held = nil
		}
		if !from.startedBefore(sr.started) || g.noWriteHeard(id, sr.epoch) {
			return sr.r, nil
		}
		// A read older than this caller, and a write heard since: the next
		// one starts after this one ended, so after this caller.
	}
	return g.read(ctx, id, vkey, false) // only if reads were forgotten under it again and again: its own
}
