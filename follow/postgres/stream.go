package pgfollow

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/backoff"
)

// session is one replication connection's stream, read by one goroutine
// (Run's): transactions are assembled from pgoutput's messages, applied
// in batches, and confirmed to the server only after they landed.
type session struct {
	f       *Follower
	conn    *pgconn.PgConn
	rels    map[uint32]*relation // pgoutput's relation IDs, as announced
	tx      *txn                 // the transaction being received (nil between Commit and Begin)
	pending []txn                // committed, received, not yet applied
	changes int                  // row changes in pending
	first   time.Time            // when the first of pending was received
	applied pglogrepl.LSN        // everything before it landed
	written pglogrepl.LSN        // confirmed to the server: ≤ applied, and held in every Guard's Redis
	status  time.Time            // when the last status update was sent
	warned  time.Time            // when lag was last warned of
	// verified is when the Guards' positions were last read (position.go);
	// failed when Redis last failed that or setting them (neither is tried
	// again for failPause: the stream goes on meanwhile), warnedPos when
	// that was last logged.
	verified, failed, warnedPos time.Time
}

// relation is a table as pgoutput announced it.
type relation struct {
	t   *Table // nil: not followed
	key int    // the key column's index in the tuples
}

// A batch is applied when the stream pauses for batchIdle, holds
// batchChanges row changes, or its first transaction is batchAge old.
const (
	batchIdle    = 2 * time.Millisecond
	batchChanges = 10_000
	batchAge     = 10 * time.Millisecond
	statusEvery  = 10 * time.Second // under wal_sender_timeout's default 60 s
)

// errStandby means another follower consumes the slot.
var errStandby = errors.New("pgfollow: the slot is in use by another follower")

// follow runs one session: connect, check, stream until an error.
func (f *Follower) follow(ctx context.Context) error {
	conn, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	keys, err := f.check(ctx, conn)
	if err != nil {
		return err
	}
	f.keys = keys
	confirmed, err := f.confirmed(ctx, conn)
	if err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, conn, f.opts.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + f.opts.Publication + "'"},
	})
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "55006": // object_in_use: another walsender has the slot
		return fmt.Errorf("%w: %s", errStandby, pe.Message)
	case errors.As(err, &pe) && pe.Code == "55000" && // object_not_in_prerequisite_state: invalidated since the check
		(strings.Contains(pe.Message, "can no longer get changes") || strings.Contains(pe.Detail, "invalidated")):
		return slotLost(f.opts.Slot, fmt.Sprintf("was invalidated by PostgreSQL (START_REPLICATION: %s: %s)", pe.Message, strings.TrimSuffix(pe.Detail, ".")))
	case err != nil:
		return err
	}
	f.mu.Lock()
	stoodBy := f.st.Standby
	f.mu.Unlock()
	f.setState(true, false)
	if stoodBy {
		f.log.Info("cacheguard: pgfollow: the standby takes over: the other follower let the slot go", "slot", f.opts.Slot)
	}
	s := &session{f: f, conn: conn, rels: map[uint32]*relation{}, status: time.Now(), applied: confirmed, written: confirmed}
	f.startMemory(confirmed)
	for _, h := range f.held {
		h.known = false
	}
	if err := s.verify(ctx); err != nil {
		if err := s.redisFailed(ctx, err); err != nil {
			return err
		}
	}
	return s.run(ctx)
}

func (s *session) run(ctx context.Context) error {
	for {
		deadline := s.status.Add(statusEvery)
		if v := s.nextVerify(); v.Before(deadline) {
			deadline = v
		}
		if len(s.pending) > 0 {
			deadline = time.Now().Add(batchIdle)
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && pgconn.Timeout(err): // the stream paused
			if err := s.apply(ctx); err != nil {
				return err
			}
			if !time.Now().Before(s.nextVerify()) { // idle: has Redis lost writes?
				if err := s.verify(ctx); err != nil {
					if err := s.redisFailed(ctx, err); err != nil {
						return err
					}
				}
			}
			if time.Since(s.status) >= statusEvery {
				if err := s.confirm(ctx); err != nil {
					return err
				}
			}
			continue
		case err != nil:
			return err
		}
		if err := s.handle(ctx, msg); err != nil {
			return err
		}
		if s.changes >= batchChanges || len(s.pending) > 0 && time.Since(s.first) >= batchAge {
			if err := s.apply(ctx); err != nil {
				return err
			}
		}
	}
}

// handle takes one message of the stream.
func (s *session) handle(ctx context.Context, msg pgproto3.BackendMessage) error {
	var data []byte
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		data = m.Data
	case *pgproto3.ErrorResponse:
		return pgconn.ErrorResponseToPgError(m)
	default:
		return nil
	}
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return err
		}
		s.heard(k.ServerWALEnd)
		// Everything the server decoded up to its position has been sent:
		// with nothing received and unapplied, that position is applied.
		// Confirmed at once: the server pings while the confirmed position
		// is behind its own, and not again until it hears back.
		if s.tx == nil && len(s.pending) == 0 && k.ServerWALEnd > s.applied {
			s.applied = k.ServerWALEnd
			return s.confirm(ctx)
		}
		if k.ReplyRequested {
			return s.confirm(ctx)
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		s.heard(x.ServerWALEnd)
		return s.decode(x.WALData)
	}
	return nil
}

// decode takes one pgoutput message.
func (s *session) decode(data []byte) error {
	m, err := pglogrepl.Parse(data)
	if err != nil {
		return err
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		return s.relation(m)
	case *pglogrepl.BeginMessage:
		s.tx = &txn{commit: m.CommitTime}
	case *pglogrepl.CommitMessage:
		if s.tx == nil {
			return errors.New("pgfollow: COMMIT without BEGIN in the stream")
		}
		s.tx.end = m.TransactionEndLSN
		if len(s.pending) == 0 {
			s.first = time.Now()
			s.f.mu.Lock()
			s.f.oldest = s.tx.commit
			s.f.mu.Unlock()
		}
		s.pending = append(s.pending, *s.tx)
		s.changes += len(s.tx.changes)
		s.tx = nil
	case *pglogrepl.InsertMessage:
		if r := s.rels[m.RelationID]; r != nil && r.t != nil {
			s.add(r, opInsert, m.Tuple)
		}
	case *pglogrepl.UpdateMessage:
		if r := s.rels[m.RelationID]; r != nil && r.t != nil {
			s.update(r, m.OldTuple, m.NewTuple)
		}
	case *pglogrepl.DeleteMessage:
		if r := s.rels[m.RelationID]; r != nil && r.t != nil {
			s.add(r, opDelete, m.OldTuple)
		}
	case *pglogrepl.TruncateMessage:
		for _, id := range m.RelationIDs {
			if r := s.rels[id]; r != nil && r.t != nil && s.tx != nil {
				s.tx.changes = append(s.tx.changes, change{t: r.t, op: opTruncate})
			}
		}
	}
	return nil
}

// relation records a table's layout; a followed table must still have its
// key column.
func (s *session) relation(m *pglogrepl.RelationMessage) error {
	r := &relation{t: s.f.tables[m.Namespace+"."+m.RelationName], key: -1}
	if r.t != nil {
		for i, c := range m.Columns {
			if c.Name == s.f.keys[r.t.Name] {
				r.key = i
			}
		}
		if r.key < 0 {
			return fmt.Errorf("%w: table %s has no column %q any more", ErrSetup, r.t.Name, s.f.keys[r.t.Name])
		}
	}
	s.rels[m.RelationID] = r
	return nil
}

// add records an INSERT's or a DELETE's change of the key in tuple; a row
// whose key is NULL has no ID, so nothing is recorded.
func (s *session) add(r *relation, o op, tuple *pglogrepl.TupleData) {
	switch key, k := s.key(r, tuple); k {
	case keyText:
		s.record(r, o, key)
	case keyNull:
		s.f.log.Debug("cacheguard: pgfollow: a row with a NULL key has no ID: nothing to apply", "table", r.t.Name)
	}
}

// record appends a change of key to the transaction being received.
func (s *session) record(r *relation, o op, key string) {
	if s.tx != nil {
		s.tx.changes = append(s.tx.changes, change{t: r.t, op: o, key: key})
	}
}

// update records an UPDATE by its key before and after: a NULL key is no
// ID, so NULL to a value creates one (Add) and a value to NULL deletes one;
// a changed key deletes the old ID and creates the new. The old tuple is
// sent when the key changed (or always, with REPLICA IDENTITY FULL).
func (s *session) update(r *relation, old, new *pglogrepl.TupleData) {
	ok, okind := s.key(r, old)
	nk, nkind := s.key(r, new)
	if nkind == keyAbsent { // the key left out of the new tuple (TOASTed, unchanged): the old one has it
		nk, nkind = ok, okind
	}
	switch {
	case nkind == keyAbsent:
		s.f.log.Error("cacheguard: pgfollow: an UPDATE whose key was not sent: not applied", "table", r.t.Name)
	case nkind == keyNull && okind == keyText:
		s.f.log.Debug("cacheguard: pgfollow: an UPDATE set the key to NULL: its old ID deleted", "table", r.t.Name, "id", logID(ok))
		s.record(r, opDelete, ok)
	case nkind == keyNull:
		s.f.log.Debug("cacheguard: pgfollow: an UPDATE of a row with a NULL key: it has no ID, nothing to apply", "table", r.t.Name)
	case okind == keyNull:
		s.f.log.Debug("cacheguard: pgfollow: an UPDATE gave a NULL key a value: its ID added", "table", r.t.Name, "id", logID(nk))
		s.record(r, opInsert, nk)
	case okind == keyText && ok != nk:
		s.record(r, opDelete, ok)
		s.record(r, opInsert, nk)
		s.record(r, opUpdate, nk)
	default:
		s.record(r, opUpdate, nk)
	}
}

// keyKind says what a tuple holds in its key column.
type keyKind uint8

const (
	keyAbsent keyKind = iota // no tuple, or the value left out (TOASTed, unchanged)
	keyNull
	keyText
)

// key is the key column's text in tuple, and what the tuple holds there.
func (s *session) key(r *relation, tuple *pglogrepl.TupleData) (string, keyKind) {
	if tuple == nil || r.key >= len(tuple.Columns) {
		return "", keyAbsent
	}
	switch c := tuple.Columns[r.key]; c.DataType {
	case pglogrepl.TupleDataTypeText:
		return string(c.Data), keyText
	case pglogrepl.TupleDataTypeNull:
		return "", keyNull
	}
	return "", keyAbsent
}

// heard records the server's WAL position, and warns (at most every
// 10 s) while the follower lags past LagWarn.
func (s *session) heard(end pglogrepl.LSN) {
	s.f.mu.Lock()
	s.f.st.ServerLSN = max(s.f.st.ServerLSN, uint64(end))
	lag := s.f.st.ServerLSN - min(s.f.st.ServerLSN, uint64(s.applied))
	s.f.mu.Unlock()
	if lag > s.f.opts.LagWarn && time.Since(s.warned) >= 10*time.Second {
		s.warned = time.Now()
		s.f.log.Warn("cacheguard: pgfollow: lagging; the server keeps the WAL for the slot", "slot", s.f.opts.Slot, "lag_bytes", lag)
	}
}

// apply applies pending until it lands, retrying with back-off while
// Redis fails (the position held, the connection kept alive), then
// confirms it.
func (s *session) apply(ctx context.Context) error {
	if len(s.pending) == 0 {
		return nil
	}
	pause := backoff.New(50*time.Millisecond, 2*time.Second, true)
	var warned time.Time
	began := time.Now()
	for {
		s.f.wrote = s.f.wrote[:0]
		err := s.f.apply(ctx, s.pending)
		if err == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(err, guard.ErrClosed) {
			return err
		}
		s.f.mu.Lock()
		s.f.st.Retries++
		s.f.mu.Unlock()
		if time.Since(warned) >= 10*time.Second {
			warned = time.Now()
			s.f.log.Warn("cacheguard: pgfollow: applying changes failed; holding the slot's position and retrying", "err", err)
		}
		if time.Since(s.status) >= statusEvery {
			if err := s.confirm(ctx); err != nil {
				return err
			}
		}
		if err := pause.Wait(ctx, 0, nil); err != nil {
			return err
		}
	}
	if s.f.insp != nil && s.f.insp.landed(s.f.wrote, began) {
		s.f.log.Warn("cacheguard: pgfollow: inspector: 100,000 samples wait for their checks; fewer are taken until "+
			"they drain (lower Inspect.Rate or the Delays)", "slot", s.f.opts.Slot)
	}
	last := s.pending[len(s.pending)-1]
	s.applied = last.end
	s.f.remember(s.pending)
	s.f.mu.Lock()
	s.f.st.Transactions += uint64(len(s.pending))
	s.f.st.Changes += uint64(s.changes)
	s.f.st.LastApplied = time.Now()
	s.f.oldest = time.Time{}
	s.f.mu.Unlock()
	s.pending, s.changes = s.pending[:0], 0
	return s.confirm(ctx)
}

// confirm sets the applied position in every Guard's Redis, then sends it
// to the server: the slot may drop the WAL before it, and a restart resumes
// there. While Redis fails, the position confirmed stays where Redis holds it.
func (s *session) confirm(ctx context.Context) error {
	s.status = time.Now()
	if s.applied > s.written && time.Since(s.failed) >= failPause {
		err := s.advance(ctx)
		if err == nil {
			s.written = s.applied
		} else if err := s.redisFailed(ctx, err); err != nil {
			return err
		}
		s.f.mu.Lock()
		s.f.st.AppliedLSN = uint64(s.written)
		s.f.mu.Unlock()
	}
	return pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: s.written})
}

// nextVerify is when the idle check is due: verifyEvery after the last,
// and failPause after Redis last failed.
func (s *session) nextVerify() time.Time {
	next := s.verified.Add(verifyEvery)
	if f := s.failed.Add(failPause); f.After(next) {
		return f
	}
	return next
}

// redisFailed takes an error of checking, setting or repairing the
// positions: nil when it may be tried again (logged at most every 10 s,
// tried after failPause), or err itself when Run must end.
func (s *session) redisFailed(ctx context.Context, err error) error {
	if !retryable(ctx, err) {
		return err
	}
	s.failed = time.Now()
	if time.Since(s.warnedPos) >= 10*time.Second {
		s.warnedPos = time.Now()
		s.f.log.Warn("cacheguard: pgfollow: checking the follower's position in redis (or repairing what it lost) "+
			"failed; the slot stays at the last position set, tried again in a second", "err", err)
	}
	return nil
}

// retryable reports whether err is Redis failing (tried again later), not
// the end of Run (ctx done, a Guard closed).
func retryable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, guard.ErrClosed)
}
