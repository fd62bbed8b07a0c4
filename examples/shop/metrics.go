package main

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/cacheguard/cacheguard/guard"
)

// metrics writes the shop's counters in the Prometheus text format. The
// registry is the shop's own (no global state, no per-ID labels).
func (s *Shop) metrics(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	counter := func(name, help string, samples ...string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
		for _, smp := range samples {
			fmt.Fprintf(&b, "%s%s\n", name, smp)
		}
	}
	dbq := []string{fmt.Sprintf(`{path="guard"} %d`, s.store.queries.Load()), fmt.Sprintf(`{path="naive"} %d`, s.naiveStore.queries.Load())}
	cmds := []string{fmt.Sprintf(`{path="guard"} %d`, s.guardCmds.Commands()), fmt.Sprintf(`{path="naive"} %d`, s.naiveCmd.Commands())}
	for _, v := range s.variants {
		dbq = append(dbq, fmt.Sprintf(`{path=%q} %d`, v.label, v.store.queries.Load()))
		cmds = append(cmds, fmt.Sprintf(`{path=%q} %d`, v.label, v.cmds.Commands()))
	}
	counter("shop_db_queries_total", "Database queries, by request path.", dbq...)
	counter("shop_redis_commands_total", "Redis commands sent, by request path.", cmds...)
	var gets, ops []string
	for _, g := range []*guard.Guard{s.products, s.users} {
		st, n := g.Stats(), g.Name()
		for _, o := range []struct {
			label string
			v     uint64
		}{{"hit", st.Hits}, {"empty_marker", st.EmptyHits}, {"bloom_reject", st.BloomRejects}, {"miss", st.Misses}} {
			gets = append(gets, fmt.Sprintf(`{guard=%q,outcome=%q} %d`, n, o.label, o.v))
		}
		for _, o := range []struct {
			label string
			v     uint64
		}{{"load", st.Loads}, {"load_error", st.LoadErrors}, {"redis_error", st.RedisErrors},
			{"coalesced", st.Coalesced}, {"lock_wait", st.LockWaits}, {"wakeup", st.Wakeups},
			{"stale_write_refused", st.StaleWrites}, {"bloom_bypass", st.BloomBypasses}} {
			ops = append(ops, fmt.Sprintf(`{guard=%q,event=%q} %d`, n, o.label, o.v))
		}
	}
	counter("cacheguard_gets_total", "guard.Get calls by outcome.", gets...)
	counter("cacheguard_events_total", "Guard operations and events.", ops...)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}
