package chaos

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain runs a service process when the deployment starts this binary as
// one (CHAOS_ROLE=service), and the tests otherwise.
func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "service" {
		os.Exit(service())
	}
	os.Exit(m.Run())
}

// TestChaos: the deployment under the fault schedule of CHAOS_SEED (a new
// seed, printed, if unset) for CHAOS_DURATION (default 60s), checked by
// Check. CHAOS_REPORT names the report's file (default latest.md here);
// CHAOS_CONTROL=unsignalled is the control run: the services commit their
// writes but do not tell the Guard, and the run must report violations.
// CHAOS_CLUSTER=1 runs it on a Redis Cluster, whose faults add a master
// failover and a slot migration.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the deployment under faults for a minute: make test, make chaos")
	}
	cfg := config{duration: time.Minute, seed: uint64(time.Now().UnixNano() % 1_000_000), report: "latest.md", control: os.Getenv(envControl)}
	if v := os.Getenv("CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHAOS_DURATION: %v", err)
		}
		cfg.duration = d
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED: %v", err)
		}
		cfg.seed = s
	}
	if v := os.Getenv("CHAOS_REPORT"); v != "" {
		cfg.report = v
	}
	cfg.cluster = os.Getenv(envCluster) == "1"
	if cfg.control != "" && cfg.control != "unsignalled" {
		t.Fatalf("CHAOS_CONTROL=%q: want unsignalled or nothing", cfg.control)
	}
	t.Logf("chaos: seed %d, %v (replay: make chaos SEED=%d DURATION=%v)", cfg.seed, cfg.duration, cfg.seed, cfg.duration)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.duration+5*time.Minute)
	defer cancel()
	d := deploy(ctx, t, cfg)
	res := d.run(ctx)
	text := res.markdown()
	if err := os.WriteFile(cfg.report, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + text)
	v, f, u := res.check.Violated(), res.check.FalseNotFounds(), res.check.UnavailableRedisUp
	if cfg.control != "" {
		if v == 0 {
			t.Fatalf("control run %s: no violation found: the checker cannot see what the write path prevents", cfg.control)
		}
		return
	}
	if v != 0 || f != 0 || u != 0 || res.check.Reads == 0 {
		d.keep = true
		t.Fatalf("%s\nthe processes' logs and histories are kept in %s", strings.TrimSpace(res.line()), d.dir)
	}
}

type config struct {
	duration time.Duration
	seed     uint64
	report   string
	control  string
	cluster  bool // a Redis Cluster of 3 masters and 3 replicas (CHAOS_CLUSTER=1)
}

// line is the report's last line.
func (r *result) line() string {
	where := ""
	if r.cfg.cluster {
		where = " on a Redis Cluster"
	}
	return fmt.Sprintf("chaos: seed %d, %v%s, %d reads checked, %d violations, %d false not-found, %d 503s with Redis up\n",
		r.cfg.seed, r.cfg.duration, where, r.check.Reads, r.check.Violated(), r.check.FalseNotFounds(), r.check.UnavailableRedisUp)
}
