package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/pgserver"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// outsideRows is the catalogue of the scenario "writes from outside the
// service"; each round changes outsideChanged of its rows straight in the
// database (half updated, half deleted).
const (
	outsideRows    = 2000
	outsideChanged = 400
)

// outsideResult is one round of the scenario.
type outsideResult struct {
	follower     bool
	changed      int           // rows updated or deleted outside the service
	stale        int           // reads afterwards that answered otherwise than the database
	caughtUpWait time.Duration // from the last commit until the follower had applied it
}

// outside runs the scenario "writes from outside the service": a shop on
// PostgreSQL serves its products while rows are updated and deleted
// straight in the database (as psql, a migration or another service
// would), once with no follower and once with one; every product is then
// read through the shop and compared with the database. It needs
// PostgreSQL's binaries (make test installs them); without them it says
// so and returns nil. With charts set, its rounds are drawn on that
// dashboard (path "outside", a band per round).
func outside(ctx context.Context, stdout io.Writer, log *slog.Logger, charts *live) ([]outsideResult, error) {
	pg, err := pgserver.Start("wal_level=logical")
	if errors.Is(err, pgserver.ErrNoServer) {
		fmt.Fprintln(stdout, "writes from outside the service: needs PostgreSQL (apt-get install -y postgresql); not run")
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer pg.Remove()
	rs, err := redisserver.Start(ctx, nil) // a Redis of its own: the other scenarios' entries stay apart
	if err != nil {
		return nil, err
	}
	defer rs.Stop()
	url := pg.URL("postgres")
	db, err := openStore(ctx, url)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if err := seed(ctx, db, outsideRows, 1); err != nil {
		return nil, err
	}
	shop, err := newShop(ctx, db, rs.Options(), 0, log)
	if err != nil {
		return nil, err
	}
	defer shop.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	if charts != nil {
		defer charts.attach("outside", shop)()
		defer charts.setPhase("")
	}
	srv := &http.Server{Handler: shop.Handler(5), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }() // ends with the Shutdown below
	defer func() {
		_ = srv.Shutdown(context.WithoutCancel(ctx))
		<-served
	}()
	base := "http://" + ln.Addr().String() + "/products/"

	// With the follower first: the rows a round without it leaves stale
	// stay stale until their TTL, and would count again in the next round.
	var results []outsideResult
	for round, follow := range []bool{true, false} {
		var f *pgfollow.Follower
		stop := func() {}
		if charts != nil {
			charts.setPhase(map[bool]string{true: "outside follower on", false: "outside follower off"}[follow])
		}
		if follow {
			if f, stop, err = startFollower(ctx, url, rs.Options(), log); err != nil {
				return nil, err
			}
		}
		if err := readAll(ctx, base, nil); err != nil { // every product cached
			return nil, err
		}
		// Rows round*400+1.. are changed: half get a new price, half go.
		from := round*outsideChanged + 1
		if _, err := db.ExecContext(ctx, "UPDATE products SET price_cents = price_cents + 1 WHERE id BETWEEN $1 AND $2",
			from, from+outsideChanged/2-1); err != nil {
			return nil, err
		}
		if _, err := db.ExecContext(ctx, "DELETE FROM products WHERE id BETWEEN $1 AND $2",
			from+outsideChanged/2, from+outsideChanged-1); err != nil {
			return nil, err
		}
		r := outsideResult{follower: follow, changed: outsideChanged}
		if f != nil {
			start := time.Now()
			err := caughtUp(ctx, db, f)
			r.caughtUpWait = time.Since(start)
			if err != nil {
				stop()
				return nil, err
			}
		}
		stop()
		stale := 0
		if err := readAll(ctx, base, func(id string, status int, p Product) error {
			want, err := shop.writes.Product(ctx, id)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				if status != http.StatusNotFound {
					stale++
				}
			case err != nil:
				return err
			case status != http.StatusOK || p != want:
				stale++
			}
			return nil
		}); err != nil {
			return nil, err
		}
		r.stale = stale
		results = append(results, r)
	}
	return results, nil
}

// startFollower runs a follower of products into the Guard "product" (a
// sidecar's own Guard, on the shop's Redis), with its publication and slot.
func startFollower(ctx context.Context, url string, ro *redis.Options, log *slog.Logger) (*pgfollow.Follower, func(), error) {
	if err := pgfollow.Setup(ctx, url, nil, "products"); err != nil {
		return nil, nil, err
	}
	rdb := redis.NewClient(readme(ro))
	g, err := guard.New(ctx, rdb, "product", &guard.Options{Logger: log})
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	f, err := pgfollow.New(url, []pgfollow.Table{{Name: "products", Guard: g}}, &pgfollow.Options{Logger: log})
	if err != nil {
		g.Close()
		rdb.Close()
		return nil, nil, err
	}
	run, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(run) }() // the scenario's: stopped and waited for by stop
	stop := func() {
		cancel()
		<-done
		g.Close()
		rdb.Close()
	}
	return f, stop, nil
}

// caughtUp waits (up to 30 s) until f has applied every change committed
// so far.
func caughtUp(ctx context.Context, db *sql.DB, f *pgfollow.Follower) error {
	var s string
	if err := db.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		return err
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); f.Stats().AppliedLSN < uint64(lsn); {
		if time.Now().After(deadline) {
			return fmt.Errorf("the follower did not catch up in 30 s: %+v", f.Stats())
		}
		time.Sleep(10 * time.Millisecond) // polling the follower's position
	}
	return nil
}

// readAll GETs products 1..outsideRows through the shop, handing each
// answer to check (nil: none).
func readAll(ctx context.Context, base string, check func(id string, status int, p Product) error) error {
	for i := 1; i <= outsideRows; i++ {
		id := strconv.Itoa(i)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+id, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		var p Product
		if resp.StatusCode == http.StatusOK {
			err = json.NewDecoder(resp.Body).Decode(&p)
		}
		resp.Body.Close()
		if err != nil {
			return err
		}
		if check != nil {
			if err := check(id, resp.StatusCode, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// outsideTable prints the scenario's rounds.
func outsideTable(w io.Writer, results []outsideResult) {
	fmt.Fprintln(w, "\nwrites from outside the service (PostgreSQL): rows updated and deleted straight in the database, then every product read through the shop")
	fmt.Fprintln(w, "| follower | rows changed | stale answers | follower caught up in |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, r := range results {
		on, wait := "off", "n/a"
		if r.follower {
			on, wait = "on", r.caughtUpWait.Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "| %s | %d | %d | %s |\n", on, r.changed, r.stale, wait)
	}
}
