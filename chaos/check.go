package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Timeline is what the parent saw besides the processes' histories.
type Timeline struct {
	// Confirms: the follower's slot's confirmed position, polled. A
	// committed write has taken effect once the slot confirmed its LSN: the
	// follower confirms only after its writes landed in Redis.
	Confirms []Confirm
	// Samples: whether Redis answered the services' user and the filter
	// was ready, polled.
	Samples []Sample
	// Faults in the order they began.
	Faults []Fault
}

// Confirm is one reading of the slot's confirmed_flush_lsn.
type Confirm struct {
	At  int64
	LSN uint64
}

// Sample is one reading of Redis and its filter.
type Sample struct {
	At          int64
	Up, Ready   bool
	Unreachable string `json:",omitempty"` // why not up or not ready
}

// Fault is one fault of the schedule.
type Fault struct {
	Kind       string
	Start, End int64 // the fault's action, from its first step to its last (a restart's process answering)
	// Dump: a restart from an older dump, saved at Dump: writes that took
	// effect before Dump are in it, the later ones Redis lost until the
	// repair (RepairWindow after End: "within about a second of Redis
	// answering again", README's "A failed write is replayed").
	Dump int64 `json:",omitempty"`
	// Redis: Redis or its filter could not answer from Start until Ready
	// (killed and restarting, frozen, flushed, evicting): a 503 then, or
	// within Rules.Reaction after, is no fault of the Guard, whatever the
	// samples around it say (they are 50 ms apart).
	Redis bool `json:",omitempty"`
	// Ready: the first sample after End that found Redis answering and the
	// filter ready.
	Ready int64 `json:",omitempty"`
	// Database: PostgreSQL did not answer from Start to End: a load then
	// fails.
	Database bool `json:",omitempty"`
	// Note: what the fault's action answered, when worth saying (a rebuild
	// the command refused).
	Note string `json:",omitempty"`
	// Normal: when the deployment was back to normal after it (Redis
	// answering, the filter ready, the follower past the WAL at End); 0 if
	// it never was before the next fault or the end.
	Normal int64 `json:",omitempty"`
}

// Rules are the documented windows the checker allows.
type Rules struct {
	// Local reports whether process proc keeps Local copies: its reads may
	// answer another process's write's predecessor for LocalWindow after
	// the write took effect (Options.Local: "the local TTL bounds it").
	Local       func(proc string) bool
	LocalWindow time.Duration
	// RepairWindow: after a Redis restart from an older dump, writes it
	// took back are repaired within this of Redis answering again.
	RepairWindow time.Duration
	// Reaction: a Guard whose reads failed is back on Redis within this
	// of it answering again (its circuit breaker's probe interval).
	Reaction time.Duration
}

// Violation kinds.
const (
	StaleValue    = "stale value"            // an older version than a write that had taken effect
	ValueOfGone   = "value of a deleted row" // a version although a delete had taken effect
	FalseNotFound = "false not-found"        // "not found" for an ID a write had made exist
)

// Report is the verdict over a history.
type Report struct {
	Reads, Writes      int
	Failed             int            // reads that failed otherwise than a 503
	FailedDatabase     int            // of those, reads while PostgreSQL restarted
	Unavailable        int            // 503s
	UnavailableRedisUp int            // of those, 503s while every sample said Redis up and the filter ready
	Reacting           int            // 503s within Rules.Reaction of Redis answering again
	UnknownLoads       int            // loads of IDs that never existed
	Violations         map[string]int // by kind
	InLocalWindow      int            // reads that would be stale but for the Local window
	InRepairWindow     int            // reads that would be stale but for a rollback's repair window
	Unresolved         int            // writes whose process died (or whose commit failed) before recording its version
	Examples           []string
	// LongestEffect: the longest a write took to take effect for the
	// checker (its call returning nil, or the follower's confirmation).
	LongestEffect time.Duration
}

// Violated is the count of violations of every kind.
func (r Report) Violated() int {
	n := 0
	for _, v := range r.Violations {
		n += v
	}
	return n
}

// FalseNotFounds is the count of false not-found answers.
func (r Report) FalseNotFounds() int { return r.Violations[FalseNotFound] }

const never = math.MaxInt64

var examplesMax = 20

// Check applies the rule to every read of the history.
func Check(history []Op, tl Timeline, rules Rules) Report {
	rep := Report{Violations: map[string]int{}}
	writes := map[string][]Op{}
	var intents []Op
	done := map[[2]string]bool{} // proc, ID+start of each Write
	for _, o := range history {
		switch o.Kind {
		case Write:
			done[[2]string{o.Proc, fmt.Sprint(o.ID, "@", o.Start)}] = true
			if o.Ver != 0 { // 0: nothing to change (an UPDATE of no row)
				writes[o.ID] = append(writes[o.ID], o)
				rep.Writes++
			}
		case Intent:
			intents = append(intents, o)
		case UnknownLoad:
			rep.UnknownLoads++
		}
	}
	// An intent without its Write: a version Check never learns, which a
	// read may answer and which may have deleted the row.
	open := map[string][]Op{}
	for _, o := range intents {
		if !done[[2]string{o.Proc, fmt.Sprint(o.ID, "@", o.Start)}] {
			open[o.ID] = append(open[o.ID], o)
			rep.Unresolved++
		}
	}
	confirmed := func(lsn uint64) int64 {
		if lsn == 0 {
			return never
		}
		i, _ := slices.BinarySearchFunc(tl.Confirms, lsn, func(c Confirm, l uint64) int {
			return cmp.Compare(c.LSN, l)
		})
		if i == len(tl.Confirms) { // Confirms rise: i is the first at or past lsn
			return never
		}
		return tl.Confirms[i].At
	}
	// effect is when w took effect for a reader in process proc.
	effect := func(w Op, proc string) int64 {
		t := confirmed(w.LSN)
		if w.Err == "" {
			t = min(t, w.End)
		}
		if t != never && w.Proc != proc && rules.Local != nil && rules.Local(proc) {
			t += int64(rules.LocalWindow)
		}
		return t
	}
	for _, ws := range writes {
		for _, w := range ws {
			if t := effect(w, w.Proc); t != never && w.Proc != "seed" {
				rep.LongestEffect = max(rep.LongestEffect, time.Duration(t-w.End))
			}
		}
	}
	// taken reports whether a rollback whose repair window holds a read
	// starting at start took back a write that took effect at t.
	taken := func(start, t int64) bool {
		for _, f := range tl.Faults {
			if f.Dump != 0 && start >= f.Start && start < f.End+int64(rules.RepairWindow) && t >= f.Dump && t < f.End {
				return true
			}
		}
		return false
	}
	for _, r := range history {
		if r.Kind != Read {
			continue
		}
		rep.Reads++
		switch {
		case r.Err == Err503:
			rep.Unavailable++
			switch {
			case !upThroughout(tl.Samples, r.Start, r.End) || down(tl.Faults, r.Start, r.End, 0, true):
			case down(tl.Faults, r.Start, r.End, rules.Reaction, true):
				rep.Reacting++
			default:
				rep.UnavailableRedisUp++
				rep.example("503 with Redis up and the filter ready: %s read %s at %s", r.Proc, r.ID, at(r.Start))
			}
			continue
		case r.Err != "":
			rep.Failed++
			if down(tl.Faults, r.Start, r.End, 0, false) {
				rep.FailedDatabase++
				continue
			}
			rep.example("failed: %s read %s at %s: %s", r.Proc, r.ID, at(r.Start), r.Err)
			continue
		}
		ws := append(writes[r.ID][:len(writes[r.ID]):len(writes[r.ID])], writes[AllIDs]...)
		// The newest write that had taken effect when r started, with and
		// without the windows.
		var bound, strict *Op
		repair := false
		for i := range ws {
			w := &ws[i]
			if own := effect(*w, w.Proc); own < r.Start && (strict == nil || w.Ver > strict.Ver) {
				strict = w
			}
			t := effect(*w, r.Proc)
			if t >= r.Start {
				continue
			}
			if taken(r.Start, t) {
				repair = true
				continue
			}
			if bound == nil || w.Ver > bound.Ver {
				bound = w
			}
		}
		kind := verdict(r, bound, ws, open[r.ID])
		if kind == "" {
			if verdict(r, strict, ws, open[r.ID]) != "" {
				if repair {
					rep.InRepairWindow++
				} else {
					rep.InLocalWindow++
				}
			}
			continue
		}
		rep.Violations[kind]++
		rep.example("%s: %s read %s = %d at %s; version %d (exists %v) by %s returned at %s, took effect at %s",
			kind, r.Proc, r.ID, r.Ver, at(r.Start), bound.Ver, bound.Exists, bound.Proc, at(bound.End), at(effect(*bound, r.Proc)))
	}
	return rep
}

// verdict is the kind of violation of read r against the write b that had
// taken effect when it started (nil: none), or "".
func verdict(r Op, b *Op, ws, open []Op) string {
	if b == nil {
		return ""
	}
	if r.Ver != NotFound {
		switch {
		case r.Ver >= b.Ver: // b's version, or a later write's
			return ""
		case b.Exists:
			return StaleValue
		default:
			return ValueOfGone
		}
	}
	if !b.Exists {
		return ""
	}
	// "Not found" is right if a later delete had begun by r's end.
	for _, w := range ws {
		if !w.Exists && w.Ver > b.Ver && w.Start < r.End {
			return ""
		}
	}
	for _, i := range open {
		if i.Start < r.End {
			return "" // a write whose version is unknown: it may have deleted the row
		}
	}
	return FalseNotFound
}

// upThroughout reports whether the samples from the last one before start
// to the first one after end all said up and ready (and there are some).
func upThroughout(samples []Sample, start, end int64) bool {
	i, _ := slices.BinarySearchFunc(samples, start, func(s Sample, t int64) int { return cmp.Compare(s.At, t) })
	if i == 0 || i == len(samples) {
		return false // no sample before the read, or none after
	}
	for i--; i < len(samples); i++ {
		if !samples[i].Up || !samples[i].Ready {
			return false
		}
		if samples[i].At > end {
			return true
		}
	}
	return false
}

// down reports whether a fault kept Redis (or PostgreSQL) from answering
// during part of [start, end], or until after within before start.
func down(faults []Fault, start, end int64, after time.Duration, redis bool) bool {
	for _, f := range faults {
		if (redis && f.Redis || !redis && f.Database) && f.Start <= end && max(f.End, f.Ready)+int64(after) >= start {
			return true
		}
	}
	return false
}

func (r *Report) example(format string, args ...any) {
	if len(r.Examples) < examplesMax {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// at formats a recorded time for a report: UTC, to the microsecond.
func at(t int64) string {
	if t == never {
		return "never"
	}
	return time.Unix(0, t).UTC().Format("15:04:05.000000")
}

// String is the report's summary lines.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "reads checked %d, writes %d (%d unresolved), failed reads %d (%d while PostgreSQL restarted), "+
		"503s %d (%d with Redis up and the filter ready, %d as the Guards came back to Redis), loads of unknown IDs %d\n",
		r.Reads, r.Writes, r.Unresolved, r.Failed, r.FailedDatabase, r.Unavailable, r.UnavailableRedisUp, r.Reacting, r.UnknownLoads)
	fmt.Fprintf(&b, "violations: %s %d, %s %d, %s %d; allowed: %d in a Local window, %d in a rollback's repair window; longest a write took to take effect %v\n",
		StaleValue, r.Violations[StaleValue], ValueOfGone, r.Violations[ValueOfGone], FalseNotFound, r.Violations[FalseNotFound],
		r.InLocalWindow, r.InRepairWindow, r.LongestEffect.Round(time.Millisecond))
	return b.String()
}
