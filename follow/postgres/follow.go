// Package pgfollow makes every committed row change of PostgreSQL tables
// visible through their Guards, whoever wrote it: a follower reads the
// tables' publication through a logical replication slot (pgoutput) and
// turns each change into the Guard's write, by a key column. INSERT → Add;
// UPDATE → Invalidate (a changed key: Invalidate of the old, Add of the
// new); DELETE → Invalidate; TRUNCATE → InvalidateAll and a Rebuild of the filter from
// the table's keys. The slot's confirmed position advances only once the writes
// of every transaction up to it have landed in Redis, so a follower that
// crashes, or loses Redis or PostgreSQL, resumes from the slot with nothing
// lost (see Run).
package pgfollow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/backoff"
)

// Table maps one table's rows to a Guard.
type Table struct {
	Name  string       // "schema.table", or "table" in schema public
	Key   string       // the column whose text is the Guard's ID; "": the primary key (one column)
	Guard *guard.Guard // the Guard that caches the table's rows
}

// Options configures a Follower. The zero value is usable.
type Options struct {
	Slot        string       // the replication slot; default "cacheguard"
	Publication string       // the publication of the tables; default "cacheguard"
	Logger      *slog.Logger // default slog.Default()
	// LagWarn is the lag, in bytes of WAL, past which the follower logs a
	// warning (at most every 10 s): the server keeps that WAL for the
	// slot. Default 64 MiB.
	LagWarn uint64
	// Inspect samples the IDs the follower writes and reads each back
	// later, counting what a Get elsewhere would find inconsistent with
	// the table (Stats.Inspections); on by default at 1%.
	Inspect Inspect
}

// Errors of a follower that will not run until its set-up is fixed; Run
// returns them wrapped, with what to do.
var (
	ErrSetup   = errors.New("pgfollow: PostgreSQL is not set up for the follower")
	ErrOptions = errors.New("pgfollow: invalid options")
	// ErrSlotLost: PostgreSQL invalidated the slot (it would have kept more
	// WAL than max_slot_wal_keep_size). The changes since its position are
	// gone, so the Guards may serve stale values and false "not found"
	// answers until Recover.
	ErrSlotLost = errors.New("pgfollow: the replication slot is lost, and the changes since its position with it")
)

// Stats is a snapshot of a Follower.
type Stats struct {
	Following    bool         // consuming the slot (false: connecting, standby, or retrying)
	Standby      bool         // another follower consumes the slot: this one waits
	AppliedLSN   uint64       // the slot's position as this follower confirmed it: every change before it landed
	ServerLSN    uint64       // the server's WAL position, as last heard
	LagBytes     uint64       // ServerLSN − AppliedLSN (0 when caught up)
	LagSeconds   float64      // age of the oldest committed transaction not yet applied (0: none)
	Transactions uint64       // transactions applied
	Changes      uint64       // row changes applied
	Retries      uint64       // batches tried again after Redis failed
	Rollbacks    uint64       // times a Guard's Redis was found behind the slot (its writes repaired)
	LastApplied  time.Time    // when the last batch landed
	Inspections  []Inspection // the inspector's counts, by table and delay (nil: off)
}

// Follower follows one slot. Run it (or Recover) once at a time; Stats may
// be called any time.
type Follower struct {
	conn   string
	tables map[string]*Table // by "schema.table"
	keys   map[string]string // the tables' key columns, as the last check resolved them (Run's or Recover's goroutine)
	opts   Options
	log    *slog.Logger

	// Run's goroutine alone: each Guard's Redis, and the transactions this
	// process applied since memFrom (position.go).
	held       []*held
	mem        []txn
	memChanges int
	memFrom    pglogrepl.LSN
	wrote      []written // what the batch being applied wrote, for the inspector (Run's goroutine alone)

	insp *inspector // nil: off

	mu sync.Mutex // guards stats and oldest
	st Stats
	// oldest is the commit time of the oldest transaction received and
	// not yet applied (zero: none).
	oldest time.Time
}

// New checks the options; Run connects. conn is a PostgreSQL URL or DSN of
// a role with the REPLICATION attribute (pgconn.ParseConfig's syntax).
func New(conn string, tables []Table, opts *Options) (*Follower, error) {
	f := &Follower{conn: conn, tables: map[string]*Table{}}
	if opts != nil {
		f.opts = *opts
	}
	if err := f.opts.resolve(); err != nil {
		return nil, err
	}
	f.log = f.opts.Logger
	insp, err := newInspector(f.opts.Inspect)
	if err != nil {
		return nil, err
	}
	f.insp = insp
	if len(tables) == 0 {
		return nil, fmt.Errorf("%w: no tables", ErrOptions)
	}
	for i := range tables {
		t := tables[i]
		if t.Guard == nil {
			return nil, fmt.Errorf("%w: table %q has no Guard", ErrOptions, t.Name)
		}
		name := qualified(t.Name)
		if _, dup := f.tables[name]; dup {
			return nil, fmt.Errorf("%w: table %q named twice", ErrOptions, name)
		}
		t.Name = name
		f.tables[name] = &t
	}
	f.held = f.heldGuards()
	return f, nil
}

// resolve fills in the defaults and checks the names.
func (o *Options) resolve() error {
	if o.Slot == "" {
		o.Slot = "cacheguard"
	}
	if o.Publication == "" {
		o.Publication = "cacheguard"
	}
	if !identifier(o.Slot) || !identifier(o.Publication) {
		return fmt.Errorf("%w: slot %q and publication %q must be lower-case letters, digits and _", ErrOptions, o.Slot, o.Publication)
	}
	if o.LagWarn == 0 {
		o.LagWarn = 64 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Stats returns a snapshot of the follower's position and counters.
func (f *Follower) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.st
	if s.ServerLSN > s.AppliedLSN {
		s.LagBytes = s.ServerLSN - s.AppliedLSN
	}
	if !f.oldest.IsZero() {
		s.LagSeconds = time.Since(f.oldest).Seconds()
	}
	s.Inspections = f.insp.inspections()
	return s
}

// Run follows the slot until ctx ends (it then returns ctx's error). It
// connects, checks the set-up, and applies committed changes in batches;
// after a failure (PostgreSQL down, the connection cut, Redis failing) it
// holds the slot's position, retries with back-off and resumes from the
// slot, so every committed change is applied at least once. Applying one
// twice is harmless: each write says what the row is now (present, changed
// or gone), and a replay from an earlier position repeats the same writes
// in the same order, ending in the same state. While another follower
// consumes the slot, Run waits as a standby and takes over when it ends.
// A set-up that cannot work (wal_level, a missing slot or publication, a
// table without a usable key) ends Run with an error wrapping ErrSetup, a
// slot PostgreSQL invalidated with one wrapping ErrSlotLost (see Recover),
// and a Guard closed under it with one wrapping guard.ErrClosed.
func (f *Follower) Run(ctx context.Context) error {
	if f.insp != nil {
		ictx, cancel := context.WithCancel(ctx)
		checked := make(chan struct{})
		go func() { // Run's: stopped and waited for as Run returns
			defer close(checked)
			f.insp.run(ictx, f)
		}()
		defer func() {
			cancel()
			<-checked
		}()
	}
	pause := backoff.New(100*time.Millisecond, 5*time.Second, true)
	var lastLog time.Time
	for {
		err := f.follow(ctx)
		if f.setState(false, errors.Is(err, errStandby)) { // it followed for a while: start the back-off afresh
			pause = backoff.New(100*time.Millisecond, 5*time.Second, true)
		}
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrSetup), errors.Is(err, ErrSlotLost), errors.Is(err, guard.ErrClosed): // nothing a retry mends
			return err
		case errors.Is(err, errStandby):
			if lastLog.IsZero() || time.Since(lastLog) > time.Minute {
				f.log.Info("cacheguard: pgfollow: standby: another follower consumes the slot", "slot", f.opts.Slot, "err", err)
				lastLog = time.Now()
			}
			pause = backoff.New(time.Second, time.Second, true) // poll for the slot
		case err != nil:
			if time.Since(lastLog) > 10*time.Second {
				f.log.Warn("cacheguard: pgfollow: following stopped; resuming from the slot", "slot", f.opts.Slot, "err", err)
				lastLog = time.Now()
			}
		}
		if pause.Wait(ctx, 0, nil) != nil {
			return ctx.Err()
		}
	}
}

// setState records whether the follower consumes the slot, and reports
// whether it did until now.
func (f *Follower) setState(following, standby bool) (was bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	was = f.st.Following
	f.st.Following, f.st.Standby = following, standby
	if !following {
		f.oldest = time.Time{} // received, unapplied changes are dropped: the slot sends them again
	}
	return was
}

// qualified is a table name with its schema ("public" unless given).
func qualified(name string) string {
	if strings.Contains(name, ".") {
		return name
	}
	return "public." + name
}

// identifier reports whether s is a plain lower-case SQL identifier, safe
// to write into replication commands unquoted.
func identifier(s string) bool {
	if s == "" || len(s) > 63 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
