package aside

import (
	"context"
	"errors"
)

// joined is a caller's part in a flight: the call that ran it, what it
// found, and how the caller stood to it.
type joined[T any] struct {
	c      *call[T]
	fl     flight
	shared bool // the answer went to more than one caller
	mine   bool // this caller's function ran the flight
	older  bool // the flight started before the caller: its answer may predate a write
}

// join runs the flight key in this process, or joins the one under way, for
// a caller that started at from. A flight's answer serves a caller only if
// the flight (or its load) started after the caller did: otherwise a write
// that returned between the two could be missing from it (older). With
// Options.Local an older flight serves too when the local epoch did not move
// (no write made or heard since). Every caller is answered when the flight
// ends, after its write, release and publish ran in Redis: a process may
// exit as soon as its Gets return, and must not leave the lock behind.
func join[T any](ctx context.Context, g *Engine, key string, from since, proto call[T],
	fly func(c *call[T], ctx context.Context) (flight, error),
) (joined[T], error) {
	serves := func(fl flight) bool { // the rule above
		return !from.startedBefore(fl.started) || g.noWriteHeard(fl.epoch, from.epoch)
	}
	j := joined[T]{c: &call[T]{g: proto.g, id: proto.id, vkey: proto.vkey, load: proto.load, held: proto.held}}
	c := j.c
	giveBack := func() { // a flight under way may wait for the lock this caller's read took
		if c.claimHeld(heldByCaller) {
			g.giveBack(c.held, c.vkey)
		}
	}
	onJoin := giveBack
	if hook := g.joinedHook.Load(); hook != nil {
		onJoin = func() { giveBack(); (*hook)(key) }
	}
	var err error
	j.fl, j.shared, err = g.flights.DoOnJoin(ctx, key, func(ctx context.Context) (flight, error) {
		return fly(c, ctx)
	}, onJoin)
	giveBack()                 // or it left before its own flight took the lock
	j.mine = j.fl.by == any(c) // this caller's function ran the flight
	answered := err == nil || errors.Is(err, ErrNotFound)
	j.older = j.fl.by != nil && answered && !serves(j.fl)
	return j, err
}

// joinServed joins flights of key until one serves the caller (join), four
// times at most: the one retry loop of fill and loadThrough. Between two
// rounds reread, if set, may answer instead (it reports whether it did).
func joinServed[T any](ctx context.Context, g *Engine, key string, from since, proto call[T],
	fly func(c *call[T], ctx context.Context) (flight, error), reread func() bool,
) (j joined[T], err error) {
	for attempt := 0; ; attempt++ {
		j, err = join(ctx, g, key, from, proto, fly)
		proto.held = nil // join gave it to the flight or back; a later round attempts as usual
		if !j.older || attempt == 3 || reread != nil && reread() {
			return j, err
		}
	}
}

// answerJoined is a caller's answer from its flight: counted, a panic made
// ErrLoaderPanic, and its own copy of the value. through: a load-through.
func answerJoined[T any](ctx context.Context, g *Engine, id string, j joined[T], err error, through bool) (T, error) {
	g.answered(ctx, j.fl.outcome, j.shared && !j.mine, through)
	if err != nil {
		var zero T
		return zero, panicked(g, id, err)
	}
	if j.mine && j.c.decoded {
		return j.c.v, nil // the flight has put its answer in the local cache (keep)
	}
	return decodeFrame[T](g, id, j.fl.frame)
}

// noWriteHeard reports whether the local cache heard of no write between
// two epochs read while it was armed (arming raises the epoch, so an epoch
// read before the subscription never equals one read after it).
func (g *Engine) noWriteHeard(then, now uint64) bool {
	return g.local != nil && then != 0 && then == now && g.local.sub.Load() != nil
}
