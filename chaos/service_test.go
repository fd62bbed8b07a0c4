package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
)

// A service process: one Guard of the deployment ("item", prefix chaos),
// its readers and its writer, each recording what it did. CHAOS_KIND says
// which: "local" (Options.Local, reads through For), "http" (reads through
// the net/http middleware and GetMany), "refresh" (RefreshAhead, reads with
// guard.Get).

// env of a service process.
const (
	envRole    = "CHAOS_ROLE"
	envKind    = "CHAOS_KIND"
	envProc    = "CHAOS_PROC"    // the process and its incarnation, "s0.1"
	envSlot    = "CHAOS_SLOT"    // which IDs its writer owns
	envHistory = "CHAOS_HISTORY" // its history file
	envRedis   = "CHAOS_REDIS"   // redis://app:secret@host:port
	envPG      = "CHAOS_PG"
	envControl = "CHAOS_CONTROL" // "unsignalled": the writer commits but does not tell the Guard
	envCluster = "CHAOS_CLUSTER" // "1": CHAOS_REDIS is a cluster URL
)

// The IDs: "i<n>" for n < seeded exist at the start, owned by the writer of
// slot n%4 (slot 3 is the writer in SQL); "n<slot>-<k>" and "o<k>" for k <
// spread are created and deleted by the services' writers and the one in
// SQL; "x<n>" never exist.
const (
	seeded = 2000
	spread = 300
)

// readers per service, and the pauses that set the load (on two cores with
// everything else: well under what saturates them).
const (
	readers    = 4
	readPace   = 2 * time.Millisecond
	writePace  = 20 * time.Millisecond
	sqlWriters = 4 // the slot of the writer in SQL
)

func service() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	kind, proc := os.Getenv(envKind), os.Getenv(envProc)
	slot, _ := strconv.Atoi(os.Getenv(envSlot))
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "chaos service %s: %v\n", proc, err)
		return 2
	}
	rec, err := NewRecorder(os.Getenv(envHistory), proc)
	if err != nil {
		return fail(err)
	}
	defer rec.Close()
	rdb, err := client(os.Getenv(envRedis), os.Getenv(envCluster) == "1")
	if err != nil {
		return fail(err)
	}
	defer rdb.Close()
	pool, err := pgxpool.New(ctx, os.Getenv(envPG))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	redis.SetLogger(guard.RedisLogger(log))
	opts := &guard.Options{KeyPrefix: "chaos", Logger: log, Filter: guard.FilterOptions{
		ExpectedItems: 50_000,
		IDs: func(ctx context.Context) iter.Seq2[string, error] {
			return guard.Rows(pool.Query(ctx, "SELECT id FROM items"))
		},
	}}
	switch kind {
	case "local":
		opts.Local = &guard.LocalOptions{}
	case "refresh":
		opts.RefreshAhead = true
	}
	g, err := guard.New(ctx, rdb, "item", opts)
	if err != nil {
		return fail(err)
	}
	defer g.Close()
	load := func(ctx context.Context, id string) (int64, error) {
		if strings.HasPrefix(id, "x") {
			rec.Record(Op{Kind: UnknownLoad, ID: id, Start: time.Now().UnixNano()})
		}
		var v int64
		err := pool.QueryRow(ctx, "SELECT v FROM items WHERE id = $1", id).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, guard.ErrNotFound
		}
		return v, err
	}
	items, err := guard.For(g, load)
	if err != nil {
		return fail(err)
	}
	s := &svc{kind: kind, slot: slot, rec: rec, pool: pool, items: items, unsignalled: os.Getenv(envControl) == "unsignalled"}
	if kind == "http" {
		if s.base, err = serve(ctx, items, &s.wg); err != nil {
			return fail(err)
		}
		s.client = &http.Client{Timeout: 10 * time.Second}
	}
	for i := range readers {
		s.wg.Go(func() { s.read(ctx, rand.New(rand.NewPCG(uint64(slot), uint64(i)))) })
	}
	s.wg.Go(func() { s.write(ctx, rand.New(rand.NewPCG(uint64(slot), 99))) })
	s.wg.Wait()
	return 0
}

// client is README's client for url: one server, or with cluster a Redis
// Cluster (a cluster URL, its nodes after the first in addr= parameters).
func client(url string, cluster bool) (redis.UniversalClient, error) {
	if !cluster {
		o, err := redis.ParseURL(url)
		if err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled, o.DialerRetries, o.MaxRetries = true, 1, -1
		return redis.NewClient(o), nil
	}
	o, err := redis.ParseClusterURL(url)
	if err != nil {
		return nil, err
	}
	o.ContextTimeoutEnabled, o.DialerRetries, o.MaxRetries = true, 1, -1
	return redis.NewClusterClient(o), nil
}

type svc struct {
	kind, base  string
	slot        int
	rec         *Recorder
	pool        *pgxpool.Pool
	items       *guard.Cache[int64]
	client      *http.Client
	unsignalled bool
	wg          sync.WaitGroup // the readers, the writer and the HTTP server, ended by the process's ctx
}

// serve serves GET /items/{id} behind the middleware, on a free port.
func serve(ctx context.Context, items *guard.Cache[int64], wg *sync.WaitGroup) (string, error) {
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", nethttp.Middleware(items.Guard(), nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := items.Get(r.Context(), r.PathValue("id"))
		if err != nil {
			nethttp.Error(w, r, err)
			return
		}
		fmt.Fprint(w, v)
	})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	wg.Go(func() { _ = srv.Serve(ln) })
	wg.Go(func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.WithoutCancel(ctx))
	})
	return "http://" + ln.Addr().String(), nil
}

// pick draws the ID of a read: mostly the seeded ones, the first hottest.
func pick(r *rand.Rand, zipf *rand.Zipf) string {
	switch n := r.IntN(100); {
	case n < 70:
		return "i" + strconv.FormatUint(zipf.Uint64(), 10)
	case n < 80:
		return fmt.Sprintf("n%d-%d", r.IntN(3), r.IntN(spread))
	case n < 85:
		return "o" + strconv.Itoa(r.IntN(spread))
	default:
		return "x" + strconv.FormatUint(r.Uint64(), 36)
	}
}

func (s *svc) read(ctx context.Context, r *rand.Rand) {
	zipf := rand.NewZipf(r, 1.1, 8, seeded-1)
	for ctx.Err() == nil {
		time.Sleep(readPace) // the load: a pace, not a wait for a state
		switch {
		case s.kind == "http" && r.IntN(10) < 3:
			ids := make([]string, 8)
			for i := range ids {
				ids[i] = pick(r, zipf)
			}
			s.many(ctx, ids)
		case s.kind == "http":
			s.get(ctx, pick(r, zipf))
		case s.kind == "refresh":
			id := pick(r, zipf)
			start := time.Now().UnixNano()
			v, err := guard.Get(ctx, s.items.Guard(), id, s.load)
			s.answer(ctx, "get", id, start, v, err)
		default:
			id := pick(r, zipf)
			start := time.Now().UnixNano()
			v, err := s.items.Get(ctx, id)
			s.answer(ctx, "for", id, start, v, err)
		}
	}
}

// load is the same loader For holds, for guard.Get.
func (s *svc) load(ctx context.Context, id string) (int64, error) {
	if strings.HasPrefix(id, "x") {
		s.rec.Record(Op{Kind: UnknownLoad, ID: id, Start: time.Now().UnixNano()})
	}
	var v int64
	err := s.pool.QueryRow(ctx, "SELECT v FROM items WHERE id = $1", id).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, guard.ErrNotFound
	}
	return v, err
}

// answer records a read's answer; one cut short by the process ending is
// not an answer.
func (s *svc) answer(ctx context.Context, via, id string, start, v int64, err error) {
	if ctx.Err() != nil {
		return
	}
	o := Op{Kind: Read, Via: via, ID: id, Start: start, End: time.Now().UnixNano(), Ver: v}
	switch {
	case errors.Is(err, guard.ErrNotFound):
		o.Ver = NotFound
	case errors.Is(err, guard.ErrUnavailable): // ErrUnconfirmed too: a 503
		o.Ver, o.Err = 0, Err503
	case err != nil:
		o.Ver, o.Err = 0, err.Error()
	}
	s.rec.Record(o)
}

func (s *svc) get(ctx context.Context, id string) {
	start := time.Now().UnixNano()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.base+"/items/"+id, nil)
	resp, err := s.client.Do(req)
	if err != nil {
		s.answer(ctx, "http", id, start, 0, err)
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	var v int64
	switch {
	case err != nil:
	case resp.StatusCode == 200:
		v, err = strconv.ParseInt(string(body), 10, 64)
	case resp.StatusCode == 404:
		err = guard.ErrNotFound
	case resp.StatusCode == 503:
		err = fmt.Errorf("%w: %s", guard.ErrUnavailable, body)
	default:
		err = fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	s.answer(ctx, "http", id, start, v, err)
}

// many reads ids with GetMany; an ID its joined error names failed, one
// missing from its map is not found.
func (s *svc) many(ctx context.Context, ids []string) {
	start := time.Now().UnixNano()
	got, err := guard.GetMany(ctx, s.items.Guard(), ids, func(ctx context.Context, ids []string) (map[string]int64, error) {
		for _, id := range ids {
			if strings.HasPrefix(id, "x") {
				s.rec.Record(Op{Kind: UnknownLoad, ID: id, Start: time.Now().UnixNano()})
			}
		}
		rows, err := s.pool.Query(ctx, "SELECT id, v FROM items WHERE id = ANY($1)", ids)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		m := map[string]int64{}
		for rows.Next() {
			var id string
			var v int64
			if err := rows.Scan(&id, &v); err != nil {
				return nil, err
			}
			m[id] = v
		}
		return m, rows.Err()
	})
	var failed []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		failed = j.Unwrap()
	} else if err != nil {
		failed = []error{err}
	}
	for _, id := range ids {
		v, ok := got[id]
		var idErr error
		if !ok {
			idErr = guard.ErrNotFound
			for _, e := range failed {
				if len(failed) == 1 && !strings.Contains(e.Error(), `"`) || strings.Contains(e.Error(), strconv.Quote(id)) {
					idErr = e
				}
			}
		}
		s.answer(ctx, "many", id, start, v, idErr)
	}
}

// write runs the writer: a database write, then the Guard's, one at a
// time, each recorded before its commit (Intent) and after (Write).
func (s *svc) write(ctx context.Context, r *rand.Rand) {
	for ctx.Err() == nil {
		time.Sleep(writePace) // the load: a pace
		var id string
		if r.IntN(2) == 0 {
			id = "i" + strconv.Itoa(r.IntN(seeded/sqlWriters)*sqlWriters+s.slot)
		} else {
			id = fmt.Sprintf("n%d-%d", s.slot, r.IntN(spread))
		}
		op := r.IntN(10)
		start := time.Now().UnixNano()
		s.rec.Record(Op{Kind: Intent, ID: id, Start: start})
		var ver int64
		var exists bool
		var err error
		switch {
		case op < 6:
			exists = true
			err = s.pool.QueryRow(ctx, "UPDATE items SET v = nextval('ver') WHERE id = $1 RETURNING v", id).Scan(&ver)
		case op < 8:
			exists = true
			err = s.pool.QueryRow(ctx, "INSERT INTO items VALUES ($1, nextval('ver')) ON CONFLICT DO NOTHING RETURNING v", id).Scan(&ver)
		default:
			err = s.pool.QueryRow(ctx, "WITH d AS (DELETE FROM items WHERE id = $1 RETURNING 1) SELECT nextval('ver') FROM d", id).Scan(&ver)
		}
		if errors.Is(err, pgx.ErrNoRows) { // nothing to change: a write of nothing
			s.rec.Record(Op{Kind: Write, ID: id, Start: start, End: time.Now().UnixNano()})
			continue
		}
		if err != nil {
			continue // the commit's outcome is unknown: the Intent stays open
		}
		lsn, lerr := walPosition(ctx, s.pool)
		if lerr != nil {
			lsn = 0 // the checker never dates it from the follower
		}
		var call string
		switch {
		case s.unsignalled:
			call = "none"
		case op < 6 && r.IntN(2) == 0:
			call, err = "set", s.items.Set(ctx, id, ver)
		case op < 6:
			call, err = "invalidate", s.items.Invalidate(ctx, id)
		case op < 8:
			call, err = "add", s.items.Add(ctx, id)
		case r.IntN(2) == 0:
			call, err = "delete", s.items.Delete(ctx, id)
		default:
			call, err = "invalidate", s.items.Invalidate(ctx, id)
		}
		o := Op{Kind: Write, Via: call, ID: id, Ver: ver, Exists: exists, Start: start, End: time.Now().UnixNano(), LSN: lsn}
		if err != nil {
			o.Err = err.Error()
		}
		s.rec.Record(o)
	}
}

// walPosition is PostgreSQL's WAL position now: past the commit of every
// transaction that returned before it was read.
func walPosition(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (uint64, error) {
	var lsn int64
	err := q.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0')::bigint").Scan(&lsn)
	return uint64(lsn), err
}
