package pgfollow

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cacheguard/cacheguard/internal/feed"
)

// Writes Redis lost: the slot confirms a position only after the follower's
// writes up to it landed, but Redis acknowledges a write before its dump or
// replica has it. So every Guard's Redis holds the follower's position too,
// set (compare-and-set) after the writes it covers and before the slot is
// confirmed: a Redis that restarted from an older dump, failed over to a
// lagging replica, or was flushed shows a lower position (or none) than the
// slot. The follower compares them when a session starts, every second
// while idle, and at each confirmation; the changes in between are replayed
// from this process's memory of what it applied, or, past that memory (a
// new process, a standby taking over), the Guard's entries are dropped and
// its filter rebuilt from the table.

// Bounds of the memory of applied transactions; the idle check's period,
// and the pause after Redis failed it.
const (
	rememberChanges = 100_000
	verifyEvery     = time.Second
	failPause       = time.Second
)

// held is one Guard's Redis as the follower knows it (Run's goroutine alone).
type held struct {
	e      feed.Engine
	tables []*Table
	at     uint64 // the position Redis held when last read or set
	known  bool   // at was read or set in this session
}

// feed names the follower's position key.
func (f *Follower) feed() string { return "pgfollow:" + f.opts.Slot }

// startMemory readies the memory of applied transactions for a session that
// resumes from the slot's confirmed position: what the slot will send again
// is forgotten.
func (f *Follower) startMemory(confirmed pglogrepl.LSN) {
	if f.memFrom == 0 || confirmed < f.memFrom {
		f.mem, f.memChanges, f.memFrom = nil, 0, confirmed
		return
	}
	for len(f.mem) > 0 && f.mem[len(f.mem)-1].end > confirmed {
		f.memChanges -= len(f.mem[len(f.mem)-1].changes)
		f.mem = f.mem[:len(f.mem)-1]
	}
}

// remember records transactions that landed; the oldest are forgotten past
// rememberChanges (what is remembered always starts at memFrom).
func (f *Follower) remember(txs []txn) {
	for _, tx := range txs {
		f.mem = append(f.mem, txn{end: tx.end, commit: tx.commit, changes: append([]change(nil), tx.changes...)})
		f.memChanges += len(tx.changes)
	}
	drop := 0
	for drop < len(f.mem) && f.memChanges > rememberChanges {
		f.memChanges -= len(f.mem[drop].changes)
		f.memFrom = f.mem[drop].end
		drop++
	}
	f.mem = append(f.mem[:0:0], f.mem[drop:]...)
}

// verify reads each Guard's position and repairs those Redis lost writes of.
func (s *session) verify(ctx context.Context) error {
	s.verified = time.Now()
	for _, h := range s.f.held {
		pos, err := h.e.Position(ctx, s.f.feed())
		if err != nil {
			return err
		}
		h.at, h.known = pos, true
		if pos < uint64(s.written) {
			if err := s.repair(ctx, h); err != nil {
				return err
			}
		}
	}
	return nil
}

// advance sets every Guard's position to s.applied, repairing a Guard whose
// Redis holds less than it was last given; it reports whether all are set
// (the slot may then be confirmed there).
func (s *session) advance(ctx context.Context) error {
	for _, h := range s.f.held {
		if !h.known {
			if err := s.verify(ctx); err != nil {
				return err
			}
		}
		if h.at >= uint64(s.applied) {
			continue
		}
		pos, err := h.e.SetPosition(ctx, s.f.feed(), h.at, uint64(s.applied))
		if err != nil {
			return err
		}
		if pos != uint64(s.applied) {
			h.at = pos
			if err := s.repair(ctx, h); err != nil {
				return err
			}
		}
		h.at = uint64(s.applied)
	}
	return nil
}

// repair makes h's Guards agree with the tables again after Redis went back
// to position h.at: the remembered transactions after it are replayed if
// memory reaches back that far; otherwise every entry is dropped and the
// filters rebuilt. Then the position is set to what was applied.
func (s *session) repair(ctx context.Context, h *held) error {
	f := s.f
	f.mu.Lock()
	f.st.Rollbacks++
	f.mu.Unlock()
	from := pglogrepl.LSN(h.at)
	replay := h.at > 0 && from >= f.memFrom
	if h.at == 0 { // a first start, or a Redis emptied or flushed: nothing tells what it missed
		f.log.Info("cacheguard: pgfollow: redis holds no position of the follower (a first start, or redis was "+
			"emptied): the followed tables' entries are dropped and their filters rebuilt", "slot", f.opts.Slot,
			"confirmed_position", s.written)
	} else {
		f.log.Warn("cacheguard: pgfollow: redis lost writes the slot confirmed (a restart from an older dump, a "+
			"failover to a lagging replica); repairing", "slot", f.opts.Slot, "redis_position", from,
			"confirmed_position", s.written, "replay", replay)
	}
	for {
		var err error
		if replay {
			err = f.replay(ctx, h, from)
		} else {
			why := "redis lost writes"
			if h.at == 0 {
				why = "no position in redis"
			}
			for _, t := range h.tables {
				if err = f.reset(ctx, t, why); err != nil {
					break
				}
			}
		}
		if err != nil {
			return err
		}
		pos, err := h.e.SetPosition(ctx, f.feed(), h.at, uint64(s.applied))
		if err != nil || pos == uint64(s.applied) {
			h.at, h.known = pos, err == nil
			return err
		}
		h.at, from, replay = pos, pglogrepl.LSN(pos), pos > 0 && pglogrepl.LSN(pos) >= f.memFrom // lost again meanwhile
	}
}

// replay applies again the remembered transactions after from, for h's tables.
func (f *Follower) replay(ctx context.Context, h *held, from pglogrepl.LSN) error {
	var txs []txn
	n := 0
	for _, tx := range f.mem {
		if tx.end <= from {
			continue
		}
		var cs []change
		for _, c := range tx.changes {
			for _, t := range h.tables {
				if c.t == t {
					cs = append(cs, c)
				}
			}
		}
		txs, n = append(txs, txn{end: tx.end, changes: cs}), n+len(cs)
	}
	if err := f.apply(ctx, txs); err != nil {
		return err
	}
	f.log.Info("cacheguard: pgfollow: the changes redis lost are written again", "slot", f.opts.Slot, "changes", n)
	return nil
}

// heldGuards groups the followed tables by Guard.
func (f *Follower) heldGuards() []*held {
	by := map[feed.Engine]*held{}
	var hs []*held
	for _, name := range f.names() {
		t := f.tables[name]
		e := t.Guard.Feed()
		h := by[e]
		if h == nil {
			h = &held{e: e}
			by[e] = h
			hs = append(hs, h)
		}
		h.tables = append(h.tables, t)
	}
	return hs
}

// confirmed is the slot's confirmed position: where its stream resumes.
func (f *Follower) confirmed(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	rows, err := query(ctx, conn, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = "+literal(f.opts.Slot))
	if err != nil {
		return 0, err
	}
	if len(rows) != 1 || rows[0][0] == "" {
		return 0, fmt.Errorf("%w: replication slot %s is missing", ErrSetup, f.opts.Slot)
	}
	return pglogrepl.ParseLSN(rows[0][0])
}

// followedBefore reports whether a Guard's Redis holds a position of the
// follower's: its slot existed and was followed (a Redis that fails to
// answer says nothing).
func (f *Follower) followedBefore(ctx context.Context) bool {
	for _, h := range f.held {
		if pos, err := h.e.Position(ctx, f.feed()); err == nil && pos > 0 {
			return true
		}
	}
	return false
}
