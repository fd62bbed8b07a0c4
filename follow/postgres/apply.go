package pgfollow

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/guard"
)

// txn is one committed transaction's changes to followed tables.
type txn struct {
	end     pglogrepl.LSN // the transaction's end: confirmed once it landed
	commit  time.Time
	changes []change
}

type op uint8

const (
	opInsert op = iota + 1
	opUpdate
	opDelete
	opTruncate
)

// change is one row change (or a TRUNCATE, without a key).
type change struct {
	t   *Table
	op  op
	key string
}

// final is what a batch's changes say of one ID: the writes that make
// the Guard agree with the row as the last of them left it.
type final struct {
	inserted bool      // created in the batch: Add
	changed  bool      // updated or deleted in the batch: Invalidate
	gone     bool      // the last change deleted it: Invalidate alone
	last     op        // the last change (for the inspector's log)
	commit   time.Time // its commit, on the server's clock (likewise)
}

// writeChunk bounds the IDs of one write (one round trip each).
const writeChunk = 1000

// apply makes the Guards agree with txs, in commit order: the changes
// between two TRUNCATEs are reduced to one final state per ID and written
// in one Invalidate and one Add per Guard (they commute: both drop the
// entry and tell the filter). A TRUNCATE ends the run before it. A table's
// changes before its last TRUNCATE in txs are left out: that TRUNCATE
// drops every entry and rebuilds the filter from the table as it is now,
// and writing them first would show readers older states (a replay after a
// rollback re-sent an old DELETE, whose "not found" marker was read until
// the reset: chaos seed 4 on a cluster; TestApplySkipsWhatATruncateEnds).
func (f *Follower) apply(ctx context.Context, txs []txn) error {
	last := map[*Table][2]int{} // each table's last TRUNCATE: its transaction and change
	for i, tx := range txs {
		for j, c := range tx.changes {
			if c.op == opTruncate {
				last[c.t] = [2]int{i, j}
			}
		}
	}
	var run []change
	var commits []time.Time // of run's changes, for the inspector
	for i, tx := range txs {
		for j, c := range tx.changes {
			if l, ok := last[c.t]; ok && (i < l[0] || i == l[0] && j < l[1]) {
				continue
			}
			if c.op != opTruncate {
				run, commits = append(run, c), append(commits, tx.commit)
				continue
			}
			if err := f.write(ctx, run, commits); err != nil {
				return err
			}
			run, commits = run[:0], commits[:0]
			if err := f.reset(ctx, c.t, "TRUNCATE"); err != nil {
				return err
			}
		}
	}
	return f.write(ctx, run, commits)
}

// write applies a run of row changes (no TRUNCATE), committed at commits.
func (f *Follower) write(ctx context.Context, run []change, commits []time.Time) error {
	byTable := map[*Table]map[string]*final{}
	for i, c := range run {
		ids := byTable[c.t]
		if ids == nil {
			ids = map[string]*final{}
			byTable[c.t] = ids
		}
		st := ids[c.key]
		if st == nil {
			st = &final{}
			ids[c.key] = st
		}
		st.last, st.commit = c.op, commits[i]
		switch c.op {
		case opInsert:
			st.inserted, st.gone = true, false
		case opUpdate:
			st.changed, st.gone = true, false
		case opDelete:
			st.changed, st.gone = true, true
		}
	}
	for t, ids := range byTable {
		var inv, add []string
		for id, st := range ids {
			if f.insp != nil {
				f.wrote = append(f.wrote, written{t: t, id: id, st: *st})
			}
			// A deleted row is invalidated, not marked "not found": the
			// change may be re-sent after the row was created again (a
			// reconnect resumes from the slot's confirmed position, a
			// replay after a rollback), and a marker would then hide the
			// new row until the INSERT is applied again (chaos seed 7).
			// The next Get reads the row's absence from the table.
			if st.changed || st.gone {
				inv = append(inv, id)
			}
			if st.inserted && !st.gone {
				add = append(add, id)
			}
		}
		for _, w := range []struct {
			name string
			fn   func(context.Context, ...string) error
			ids  []string
		}{{"invalidate", t.Guard.Invalidate, inv}, {"add", t.Guard.Add, add}} {
			if err := f.writeIDs(ctx, t, w.name, w.fn, w.ids); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeIDs runs one write in chunks. An ID the Guard refuses (ErrInvalidKey:
// empty, too long, a control byte) can never be cached, so nothing stale
// can be served for it: it is logged and left out.
func (f *Follower) writeIDs(ctx context.Context, t *Table, name string, fn func(context.Context, ...string) error, ids []string) error {
	for len(ids) > 0 {
		n := min(len(ids), writeChunk)
		err := fn(ctx, ids[:n]...)
		if errors.Is(err, guard.ErrInvalidKey) {
			err = f.writeEach(ctx, t, fn, ids[:n])
		}
		if err != nil {
			return fmt.Errorf("pgfollow: %s on table %s: %w", name, t.Name, err)
		}
		ids = ids[n:]
	}
	return nil
}

// writeEach writes ids one by one, leaving out those the Guard refuses.
func (f *Follower) writeEach(ctx context.Context, t *Table, fn func(context.Context, ...string) error, ids []string) error {
	for _, id := range ids {
		switch err := fn(ctx, id); {
		case errors.Is(err, guard.ErrInvalidKey):
			f.log.Error("cacheguard: pgfollow: a key the Guard refuses as an ID: not applied", "table", t.Name, "id", logID(id), "err", err)
		case err != nil:
			return err
		}
	}
	return nil
}

// logID is id for a log line: its first 64 bytes and its length if it is
// longer (a key the Guard refuses may be megabytes long). The handler quotes
// its control bytes.
func logID(id string) string {
	if len(id) <= 64 {
		return id
	}
	return fmt.Sprintf("%s... (%d bytes)", id[:64], len(id))
}

// reset drops every entry of t's Guard and rebuilds its filter from the
// table's keys as they are now (read on a connection of its own): after a
// TRUNCATE, a lost slot, or when Redis lost writes no memory can replay.
func (f *Follower) reset(ctx context.Context, t *Table, why string) error {
	if f.insp != nil {
		f.insp.reset(t)
	}
	n, err := t.Guard.InvalidateAll(ctx)
	if err != nil {
		return fmt.Errorf("pgfollow: %s of %s: %w", why, t.Name, err)
	}
	// Force: the table may be far smaller now (the check against a short
	// source would keep the old generation).
	ids, err := t.Guard.Rebuild(ctx, f.keysOf(ctx, t), &bloom.RebuildOptions{Force: true})
	if err != nil {
		return fmt.Errorf("pgfollow: %s of %s: rebuilding the filter: %w", why, t.Name, err)
	}
	f.log.Info("cacheguard: pgfollow: "+why+": entries dropped and the filter rebuilt", "table", t.Name,
		"entries_dropped", n, "filter_ids", ids)
	return nil
}

// keysOf lists the key column of t.
func (f *Follower) keysOf(ctx context.Context, t *Table) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		conn, err := pgx.Connect(ctx, f.conn)
		if err != nil {
			yield("", err)
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		schema, table, _ := strings.Cut(t.Name, ".")
		rows, err := conn.Query(ctx, fmt.Sprintf("SELECT %[1]s::text FROM %[2]s.%[3]s WHERE %[1]s IS NOT NULL", ident(f.keys[t.Name]), ident(schema), ident(table)))
		for id, err := range guard.Rows(rows, err) {
			if !yield(id, err) {
				return
			}
		}
	}
}
