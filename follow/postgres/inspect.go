package pgfollow

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/cacheguard/cacheguard/internal/feed"
)

// The inspector: a sample of the IDs the follower writes is read back from
// Redis at each of Inspect.Delays after the write landed, as a Get in
// another process reads them (feed.Held). An entry the write should have
// dropped (filled before it, on Redis's clock), a "not found" marker older
// than an INSERT, or an inserted ID the filter does not admit is an
// inconsistency. Fill times come from Redis's clock (the entry's fill-time
// field) and are compared with Redis's clock at the check, less the local
// time elapsed since the write began: no process's clock takes part, so an
// entry filled after the write is never counted (docs/follow.md).

// Inspect configures the inspector (Options.Inspect). The zero value checks
// 1% of the IDs written, 1 s and 10 s after the write.
type Inspect struct {
	Rate   float64         // share of the IDs written that are checked, ≤ 1; 0: 0.01; negative: off
	Delays []time.Duration // when each sampled ID is checked, after its write landed; default 1 s and 10 s
	Repair bool            // an inconsistency found is repaired at once (Invalidate, or Add for the filter) and counted so
}

// Inspection counts the checks of one table at one delay.
type Inspection struct {
	Table        string
	Delay        time.Duration
	Checked      uint64   // sampled IDs read back
	Inconsistent uint64   // of them, found inconsistent
	Repaired     uint64   // of those, repaired (Inspect.Repair)
	Recent       []string // the last IDs found inconsistent, oldest first (at most inspectRecent)
}

// Nines is the consistency as nines, −log10(Inconsistent/Checked), once an
// inconsistency was found; NaN (no figure) before: with none found, the
// checks show only that it is at least log10(Checked) (AtLeast), and the
// first one found moves the figure below that.
func (i Inspection) Nines() float64 {
	if i.Inconsistent == 0 {
		return math.NaN()
	}
	return -math.Log10(float64(i.Inconsistent) / float64(i.Checked))
}

// AtLeast is what the checks show of the nines while none was found:
// log10(Checked) (0 before any check).
func (i Inspection) AtLeast() float64 {
	if i.Checked == 0 {
		return 0
	}
	return math.Log10(float64(i.Checked))
}

// Bounds of the inspector: sampled IDs waiting for their checks (more are
// not sampled), IDs read per round trip, the allowance for Redis's clock
// (slewed, or another node's after a failover), and the pace of its WARNs.
const (
	inspectPending = 100_000
	inspectBatch   = 256
	clockAllowance = 100 * time.Millisecond
	inspectWarnGap = time.Second
	inspectRecent  = 20
)

// written is one ID a batch wrote, and what it wrote (Follower.wrote).
type written struct {
	t  *Table
	id string
	st final
}

// sample is a written ID waiting for its check at one delay.
type sample struct {
	written
	delay time.Duration
	due   time.Time
	began time.Time // local, before the batch that wrote it began: the write ran after
	batch uint64    // the batch's number (a later one supersedes it)
	reset uint64    // the table's resets before the write (a later one supersedes it)
}

// inspector holds the samples; Run's goroutine adds them, the inspector's
// goroutine (started and waited for by Run) checks them.
type inspector struct {
	opts Inspect

	mu      sync.Mutex
	queues  [][]sample              // per delay, in due order
	taken   int                     // samples taken from queues, not yet done
	watched map[idOf]*watch         // the IDs with a sample queued
	resets  map[*Table]uint64       // TRUNCATEs and resets applied, per table
	counts  map[countOf]*Inspection // per table and delay
	batches uint64                  // batches applied
	full    bool                    // the queue was full (warned once per filling)
	warned  map[string]time.Time    // per table: when an inconsistency was last logged
	quiet   map[string]int          // per table: inconsistencies not logged since (inspectWarnGap)
	wake    chan struct{}           // a sample was queued
	failed  time.Time               // when a failed read-back was last logged (the inspector's goroutine alone)
}

type idOf struct {
	t  *Table
	id string
}

type countOf struct {
	table string
	delay time.Duration
}

// watch is what the inspector knows of a sampled ID: the last batch that
// wrote it, and the samples still queued.
type watch struct {
	batch  uint64
	queued int
}

// newInspector resolves o: nil when the inspector is off.
func newInspector(o Inspect) (*inspector, error) {
	switch {
	case o.Rate < 0:
		return nil, nil
	case o.Rate == 0:
		o.Rate = 0.01
	case o.Rate > 1 || math.IsNaN(o.Rate):
		return nil, fmt.Errorf("%w: Inspect.Rate %v (want ≤ 1)", ErrOptions, o.Rate)
	}
	if len(o.Delays) == 0 {
		o.Delays = []time.Duration{time.Second, 10 * time.Second}
	}
	o.Delays = slices.Clone(o.Delays)
	for _, d := range o.Delays {
		if d <= 0 {
			return nil, fmt.Errorf("%w: Inspect.Delays %v (want each > 0)", ErrOptions, o.Delays)
		}
	}
	return &inspector{opts: o, queues: make([][]sample, len(o.Delays)), watched: map[idOf]*watch{},
		resets: map[*Table]uint64{}, counts: map[countOf]*Inspection{}, wake: make(chan struct{}, 1),
		warned: map[string]time.Time{}, quiet: map[string]int{}}, nil
}

// landed takes the IDs a batch wrote (began: before the batch's first try);
// it samples some and marks the watched ones written again. It reports
// whether the queue has just filled (samples are skipped until it drains).
func (in *inspector) landed(ws []written, began time.Time) (filled bool) {
	now := time.Now()
	in.mu.Lock()
	defer in.mu.Unlock()
	in.batches++
	queued := false
	for _, w := range ws {
		k := idOf{w.t, w.id}
		wt := in.watched[k]
		if wt != nil {
			wt.batch = in.batches
		}
		if rand.Float64() >= in.opts.Rate {
			continue
		}
		if in.pending() >= inspectPending {
			filled = filled || !in.full
			in.full = true
			continue
		}
		if wt == nil {
			wt = &watch{batch: in.batches}
			in.watched[k] = wt
		}
		for i, d := range in.opts.Delays {
			in.queues[i] = append(in.queues[i], sample{written: w, delay: d, due: now.Add(d), began: began,
				batch: in.batches, reset: in.resets[w.t]})
			wt.queued++
		}
		queued = true
	}
	if queued {
		select {
		case in.wake <- struct{}{}:
		default:
		}
	}
	return filled
}

// pending counts the samples queued or being checked (in.mu held).
func (in *inspector) pending() int {
	n := in.taken
	for _, q := range in.queues {
		n += len(q)
	}
	return n
}

// reset records a TRUNCATE or reset of t: the filter was rebuilt from the
// table, so what a sample expected of it no longer holds.
func (in *inspector) reset(t *Table) {
	in.mu.Lock()
	in.resets[t]++
	in.mu.Unlock()
}

// run checks the samples as they fall due, until ctx ends (Run's goroutine
// starts it and waits for it).
func (in *inspector) run(ctx context.Context, f *Follower) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, next := in.take(time.Now())
		if len(due) > 0 {
			f.inspectDue(ctx, due)
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = time.Until(next)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-in.wake:
		case <-timer.C:
		}
	}
}

// take removes up to inspectBatch samples due by now; next is when the
// next one falls due (zero: none queued).
func (in *inspector) take(now time.Time) (due []sample, next time.Time) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.full && in.pending() < inspectPending/2 {
		in.full = false
	}
	for i, q := range in.queues {
		n := 0
		for n < len(q) && !q[n].due.After(now) && len(due) < inspectBatch {
			n++
		}
		due = append(due, q[:n]...)
		clear(q[:n]) // let go of their IDs; appends move what remains
		in.queues[i] = q[n:]
		in.taken += n
		if len(in.queues[i]) > 0 && (next.IsZero() || in.queues[i][0].due.Before(next)) {
			next = in.queues[i][0].due
		}
	}
	return due, next
}

// inspectDue reads the due samples back from Redis and judges them. A check
// Redis fails is dropped (not counted), as are those of a closed Guard.
func (f *Follower) inspectDue(ctx context.Context, due []sample) {
	in := f.insp
	byEngine := map[feed.Engine][]int{}
	for i, s := range due {
		e := s.t.Guard.Feed()
		byEngine[e] = append(byEngine[e], i)
	}
	for e, idx := range byEngine {
		ids := make([]string, len(idx))
		for j, i := range idx {
			ids[j] = due[i].id
		}
		held, err := e.Inspect(ctx, ids)
		read := time.Now()
		if err != nil {
			if ctx.Err() == nil && time.Since(in.failed) >= 10*time.Second { // Redis down: a line per 10 s
				in.failed = time.Now()
				f.log.Warn("cacheguard: pgfollow: inspector: reading back failed; those checks are dropped", "err", err)
			}
			in.done(due, idx, nil)
			continue
		}
		found := make([]string, len(idx))
		for j, i := range idx {
			if !held[j].Now.IsZero() {
				found[j] = in.judge(due[i], held[j], read)
			}
		}
		in.done(due, idx, found)
		for j, i := range idx {
			if found[j] != "" {
				f.inconsistent(ctx, due[i], found[j])
			}
		}
	}
}

// judge says what is inconsistent in h, what Redis held of s's ID (read:
// local, after the reply came), or "" when nothing is. An entry counts as
// filled before the write only if it was filled before Redis's clock at the
// check less the local time elapsed since the batch began (and the clock
// allowance): the write ran later than that, whichever clocks are off.
func (in *inspector) judge(s sample, h feed.Held, read time.Time) string {
	before := h.Now.Add(-read.Sub(s.began) - clockAllowance)
	old := !h.Filled.IsZero() && h.Filled.Before(before)
	age := h.Now.Sub(h.Filled).Round(time.Millisecond)
	switch {
	case s.st.gone: // Delete: every entry became the marker
		if old && h.Values > 0 {
			return fmt.Sprintf("a value filled %v before the check, before the DELETE was written", age)
		}
	case s.st.changed: // Invalidate: every entry dropped
		if old && h.Values+h.Markers > 0 {
			what := "a value"
			if h.Values == 0 {
				what = "a not-found marker"
			}
			return fmt.Sprintf("%s filled %v before the check, before the change was written", what, age)
		}
	}
	if !s.st.inserted || s.st.gone {
		return ""
	}
	switch {
	case old && h.Markers > 0:
		return fmt.Sprintf("a not-found marker filled %v before the check, before the INSERT was written", age)
	case !h.Admitted && !in.superseded(s):
		return notAdmitted
	}
	return ""
}

// notAdmitted is what judge says of an inserted ID the filter does not admit.
const notAdmitted = "the filter does not admit the inserted ID"

// superseded reports whether s's ID was written again, or its table reset,
// after s's write: the filter may rightly not admit it then (a DELETE and
// a rebuild).
func (in *inspector) superseded(s sample) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	wt := in.watched[idOf{s.t, s.id}]
	return wt != nil && wt.batch != s.batch || in.resets[s.t] != s.reset
}

// done counts the samples idx of due (found: what judge said of each; nil:
// not checked) and lets go of the IDs with no sample left.
func (in *inspector) done(due []sample, idx []int, found []string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.taken -= len(idx)
	for j, i := range idx {
		s := due[i]
		k := idOf{s.t, s.id}
		if wt := in.watched[k]; wt != nil {
			if wt.queued--; wt.queued <= 0 {
				delete(in.watched, k)
			}
		}
		if found == nil {
			continue
		}
		c := in.counts[countOf{s.t.Name, s.delay}]
		if c == nil {
			c = &Inspection{Table: s.t.Name, Delay: s.delay}
			in.counts[countOf{s.t.Name, s.delay}] = c
		}
		c.Checked++
		if found[j] != "" {
			c.Inconsistent++
			if c.Recent = append(c.Recent, s.id); len(c.Recent) > inspectRecent {
				c.Recent = slices.Delete(c.Recent, 0, len(c.Recent)-inspectRecent)
			}
		}
	}
}

// inconsistent logs what was found of s (at most one WARN per table per
// inspectWarnGap, with the count of those not logged: Stats.Inspections
// lists the last IDs) and repairs it if asked: Invalidate drops a stale
// entry or marker, Add makes the filter admit the ID (each safe whatever
// came after: neither can serve a value).
func (f *Follower) inconsistent(ctx context.Context, s sample, found string) {
	in := f.insp
	in.mu.Lock()
	log := time.Since(in.warned[s.t.Name]) >= inspectWarnGap
	quiet := in.quiet[s.t.Name]
	if log {
		in.warned[s.t.Name], in.quiet[s.t.Name] = time.Now(), 0
	} else {
		in.quiet[s.t.Name]++
	}
	in.mu.Unlock()
	if log {
		f.log.Warn("cacheguard: pgfollow: inconsistent: the guard serves what the table no longer holds", "table", s.t.Name,
			"id", s.id, "change", s.st.last.String(), "commit", s.st.commit.Format(time.RFC3339Nano), "delay", s.delay,
			"found", found, "not_logged_since", quiet)
	}
	if !in.opts.Repair {
		return
	}
	var err error
	if found == notAdmitted {
		err = s.t.Guard.Add(ctx, s.id)
	} else {
		err = s.t.Guard.Invalidate(ctx, s.id)
	}
	if err != nil {
		f.log.Warn("cacheguard: pgfollow: inspector: repairing an inconsistency failed", "table", s.t.Name, "id", s.id, "err", err)
		return
	}
	in.mu.Lock()
	in.counts[countOf{s.t.Name, s.delay}].Repaired++
	in.mu.Unlock()
}

// inspections returns the counts, by table and delay.
func (in *inspector) inspections() []Inspection {
	if in == nil {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]Inspection, 0, len(in.counts))
	for _, c := range in.counts {
		cp := *c
		cp.Recent = slices.Clone(c.Recent)
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b Inspection) int {
		return cmp.Or(cmp.Compare(a.Table, b.Table), cmp.Compare(a.Delay, b.Delay))
	})
	return out
}

func (o op) String() string {
	switch o {
	case opInsert:
		return "INSERT"
	case opUpdate:
		return "UPDATE"
	case opDelete:
		return "DELETE"
	}
	return "TRUNCATE"
}
