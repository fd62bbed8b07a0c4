package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/cmdcount"
)

// Shop is the demo service. The guarded routes and the naive cache-aside
// baseline share the database and the Redis server, but each has its own
// Store (query counter) and Redis client (command counter), so /metrics can
// tell their costs apart.
type Shop struct {
	store, naiveStore   *Store // reads of the guarded path and of the baseline
	writes              *Store // POST, PUT, DELETE
	products, users     *guard.Guard
	productCache        *guard.Cache[Product] // products, typed: the repository call wrapped
	guardRDB, naiveRDB  redis.UniversalClient
	guardCmds, naiveCmd *cmdcount.Counter
	log                 *slog.Logger
	tel                 *telemetry // /metrics: the registry, and the Guards' OpenTelemetry meter provider
	live                *live      // /dashboard: the sampler behind the live charts
	// variants are more guarded read paths over the products table, each
	// with options of its own, for the demo's Zipf rows.
	variants []*variant
}

// variant is a guarded read path (GET <prefix>:id) with its own Guard,
// Redis client and counted Store, so /metrics tells its costs apart.
type variant struct {
	label, prefix string
	store         *Store
	rdb           redis.UniversalClient
	cmds          *cmdcount.Counter
	g             *guard.Guard
	cache         *guard.Cache[Product]
}

// newVariant opens the variant's Guard (name product-<label>) with opts and
// rebuilds its filter from the database.
func newVariant(
	ctx context.Context,
	db *sql.DB,
	redisOpts *redis.Options,
	dbLatency time.Duration,
	label, prefix string,
	opts *guard.Options,
) (*variant, error) {
	v := &variant{label: label, prefix: prefix, store: &Store{db: db, latency: dbLatency},
		rdb: redis.NewClient(redisOpts), cmds: &cmdcount.Counter{}}
	v.rdb.AddHook(v.cmds)
	var err error
	if v.g, err = guard.New(ctx, v.rdb, "product-"+label, opts); err != nil {
		return nil, err
	}
	load := func(ctx context.Context, id string) (Product, error) {
		p, err := v.store.Product(ctx, id)
		if errors.Is(err, sql.ErrNoRows) {
			return Product{}, fmt.Errorf("%w: %w", guard.ErrNotFound, err)
		}
		return p, err
	}
	if v.cache, err = guard.For(v.g, load); err != nil {
		return nil, err
	}
	if _, err := v.g.Rebuild(ctx, (&Store{db: db}).IDs(ctx, "products"), nil); err != nil {
		return nil, err
	}
	return v, nil
}

// newShop opens the guards (creating their bloom filters) and rebuilds them
// from the database.
func newShop(ctx context.Context, db *sql.DB, redisOpts *redis.Options, dbLatency time.Duration, log *slog.Logger) (*Shop, error) {
	// Both paths get the same client, set up as README's (readme), whoever
	// passed redisOpts.
	redisOpts = readme(redisOpts)
	s := &Shop{
		store:      &Store{db: db, latency: dbLatency},
		naiveStore: &Store{db: db, latency: dbLatency},
		writes:     &Store{db: db},
		guardRDB:   redis.NewClient(redisOpts),
		naiveRDB:   redis.NewClient(redisOpts),
		guardCmds:  &cmdcount.Counter{},
		naiveCmd:   &cmdcount.Counter{},
		log:        log,
	}
	var err error
	if s.tel, err = newTelemetry(); err != nil {
		return nil, err
	}
	s.guardRDB.AddHook(s.guardCmds)
	s.naiveRDB.AddHook(s.naiveCmd)
	// Rebuilds read the database directly, not through the counted Store.
	ids := func(table string) func(context.Context) iter.Seq2[string, error] {
		raw := &Store{db: db}
		return func(ctx context.Context) iter.Seq2[string, error] { return raw.IDs(ctx, table) }
	}
	s.products, err = guard.New(ctx, s.guardRDB, "product", &guard.Options{
		Logger:    log,
		Filter:    guard.FilterOptions{ExpectedItems: 200_000, IDs: ids("products")},
		Telemetry: guard.TelemetryOptions{MeterProvider: s.tel.meter},
	})
	if err != nil {
		return nil, err
	}
	if s.productCache, err = guard.For(s.products, s.loadProduct); err != nil {
		return nil, err
	}
	s.users, err = guard.New(ctx, s.guardRDB, "user", &guard.Options{
		Logger:    log,
		Filter:    guard.FilterOptions{ExpectedItems: 20_000, IDs: ids("users")},
		Telemetry: guard.TelemetryOptions{MeterProvider: s.tel.meter},
	})
	if err != nil {
		return nil, err
	}
	for _, r := range []struct {
		g     *guard.Guard
		table string
	}{{s.products, "products"}, {s.users, "users"}} {
		if _, err := r.g.Rebuild(ctx, ids(r.table)(ctx), nil); err != nil {
			return nil, err
		}
	}
	// The in-process cache (defaults: 10,000 values for at most 1 s), and
	// refresh-ahead with a 1 s TTL so that entries expire within a demo run.
	for _, v := range []struct {
		label, prefix string
		opts          *guard.Options
	}{
		{"local", "/local/products/", &guard.Options{Logger: log, Local: &guard.LocalOptions{},
			Filter: guard.FilterOptions{ExpectedItems: 200_000}, Telemetry: guard.TelemetryOptions{MeterProvider: s.tel.meter}}},
		{"refresh", "/refresh/products/", &guard.Options{Logger: log, TTL: time.Second, RefreshAhead: true,
			Filter: guard.FilterOptions{ExpectedItems: 200_000}, Telemetry: guard.TelemetryOptions{MeterProvider: s.tel.meter}}},
	} {
		vr, err := newVariant(ctx, db, redisOpts, dbLatency, v.label, v.prefix, v.opts)
		if err != nil {
			return nil, err
		}
		s.variants = append(s.variants, vr)
	}
	s.registerMetrics()
	s.live = newLive(s.counts)
	return s, nil
}

// counts reads the counters the dashboard charts.
func (s *Shop) counts() counts {
	c := counts{
		db:    map[string]int64{"guard": s.store.queries.Load(), "naive": s.naiveStore.queries.Load()},
		redis: map[string]int64{"guard": s.guardCmds.Commands(), "naive": s.naiveCmd.Commands()},
	}
	for _, v := range s.variants {
		c.db[v.label], c.redis[v.label] = v.store.queries.Load(), v.cmds.Commands()
	}
	st := s.products.Stats()
	c.rejects, c.markers = st.BloomRejects, st.EmptyHits
	return c
}

func (s *Shop) Close() {
	s.live.close()
	_ = s.products.Close()
	_ = s.users.Close()
	for _, v := range s.variants {
		_ = v.g.Close()
		_ = v.rdb.Close()
	}
	_ = s.guardRDB.Close()
	_ = s.naiveRDB.Close()
	_ = s.tel.close(context.Background())
}

func (s *Shop) loadProduct(ctx context.Context, id string) (Product, error) {
	p, err := s.store.Product(ctx, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Product{}, fmt.Errorf("%w: %w", guard.ErrNotFound, err)
	}
	return p, err
}

func (s *Shop) loadUser(ctx context.Context, id string) (User, error) {
	u, err := s.store.User(ctx, id)
	if errors.Is(err, sql.ErrNoRows) {
		return User{}, fmt.Errorf("%w: %w", guard.ErrNotFound, err)
	}
	return u, err
}

// Handler routes: /products through Echo and its adapter (Echo v5 by
// default, v4 when echoVersion is 4; see routes and echo4.go, echo5.go), /users
// through net/http and the net/http adapter, /naive/products/:id as the
// baseline.
func (s *Shop) Handler(echoVersion int) http.Handler {
	var products http.Handler
	if echoVersion == 4 {
		products = routerV4(s.routes())
	} else {
		products = routerV5(s.routes())
	}
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", nethttp.Middleware(s.users, nil)(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			u, err := guard.Get(r.Context(), s.users, r.PathValue("id"), s.loadUser)
			if err != nil {
				nethttp.Error(w, r, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(u)
		})))
	mux.Handle("GET /metrics", s.metrics())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.store.db.PingContext(ctx); err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		if err := s.guardRDB.Ping(ctx).Err(); err != nil {
			http.Error(w, "redis unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	dashboard := s.live.handler()
	mux.Handle("/dashboard", dashboard)
	mux.Handle("/dashboard/", dashboard)
	timedPaths := map[string]string{"/naive/products/": "naive", "/products/": "guard"}
	for _, v := range s.variants {
		timedPaths[v.prefix] = v.label
	}
	mux.Handle("/", s.live.timed(products, timedPaths))
	return mux
}

// created runs after a product's INSERT committed: the ID is servable at
// once in every process (Add registers it in the filter and drops any "not
// found" marker cached while it did not exist).
func (s *Shop) created(ctx context.Context, id string) error {
	return s.productCache.Add(ctx, id)
}

// evict drops both paths' cached copies of a product.
func (s *Shop) evict(ctx context.Context, id string) error {
	if err := s.productCache.Invalidate(ctx, id); err != nil {
		return err
	}
	return s.naiveRDB.Del(ctx, naiveKey(id)).Err()
}

func naiveKey(id string) string { return "shop:naive:product:" + id }
