package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"log"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

type Product struct {
	ID    string
	Name  string
	Price int
}

func ExampleGet() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()

	// Stands in for the database.
	products := map[string]Product{"42": {ID: "42", Name: "Desk lamp", Price: 1999}}
	loadProduct := func(ctx context.Context, id string) (Product, error) {
		p, ok := products[id]
		if !ok {
			return Product{}, guard.ErrNotFound // or fmt.Errorf("...: %w", guard.ErrNotFound)
		}
		return p, nil
	}

	g, err := guard.New(ctx, rdb, "example-product", nil) // nil: default options
	if err != nil {
		panic(err)
	}
	defer g.Close()
	// Fill the bloom filter from the database once (usually a SELECT id scan).
	if _, err := g.Rebuild(ctx, func(yield func(string, error) bool) {
		for id := range products {
			if !yield(id, nil) {
				return
			}
		}
	}, nil); err != nil {
		panic(err)
	}

	p, err := guard.Get(ctx, g, "42", loadProduct) // miss: loads and caches
	fmt.Println(p.Name, err)
	p, err = guard.Get(ctx, g, "42", loadProduct) // hit: one round trip
	fmt.Println(p.Name, err)
	_, err = guard.Get(ctx, g, "does-not-exist", loadProduct) // the bloom filter says no
	fmt.Println(errors.Is(err, guard.ErrNotFound))

	st := g.Stats()
	fmt.Println("hits:", st.Hits, "loads:", st.Loads, "bloom rejects:", st.BloomRejects)
	// Output:
	// Desk lamp <nil>
	// Desk lamp <nil>
	// true
	// hits: 1 loads: 1 bloom rejects: 1
}

func ExampleGuard_Invalidate() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-price", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	price := 100
	load := func(ctx context.Context, id string) (int, error) { return price, nil }
	_ = g.Add(ctx, "sku-1") // a new row, after the INSERT committed

	v, _ := guard.Get(ctx, g, "sku-1", load)
	fmt.Println(v)

	price = 120                    // UPDATE ... committed
	_ = g.Invalidate(ctx, "sku-1") // then drop the cached copy
	v, _ = guard.Get(ctx, g, "sku-1", load)
	fmt.Println(v)
	// Output:
	// 100
	// 120
}

// A repository call wrapped by a typed handle, through a row's whole life.
func ExampleFor() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-sku", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()

	table := map[string]Product{} // the source of truth
	loads := 0
	findProduct := func(ctx context.Context, id string) (Product, error) { // the repository's method
		loads++
		p, ok := table[id]
		if !ok {
			return Product{}, fmt.Errorf("sku %s: %w", id, guard.ErrNotFound)
		}
		return p, nil
	}
	products, err := guard.For(g, findProduct)
	if err != nil {
		panic(err)
	}
	find := products.Get // the repository's signature, now cached

	_, err = find(ctx, "lamp") // asked for before it exists: a "not found" marker is cached
	fmt.Println(errors.Is(err, guard.ErrNotFound))

	table["lamp"] = Product{ID: "lamp", Name: "Desk lamp", Price: 1999} // INSERT committed
	_ = products.Add(ctx, "lamp")                                       // servable at once: the marker goes
	p, _ := find(ctx, "lamp")
	fmt.Println(p.Price)

	p.Price = 2499
	table["lamp"] = p                // UPDATE committed
	_ = products.Set(ctx, "lamp", p) // write-through: no reader pays a miss
	p, _ = find(ctx, "lamp")
	fmt.Println(p.Price)

	delete(table, "lamp")            // DELETE committed
	_ = products.Delete(ctx, "lamp") // "not found" everywhere at once, without a load
	_, err = find(ctx, "lamp")
	fmt.Println(errors.Is(err, guard.ErrNotFound))

	table["lamp"] = Product{ID: "lamp", Name: "Desk lamp", Price: 1899} // re-created
	_ = products.Add(ctx, "lamp")
	p, _ = find(ctx, "lamp")
	fmt.Println(p.Price, "loads:", loads)
	// Output:
	// true
	// 1999
	// 2499
	// true
	// 1899 loads: 3
}

// A page of IDs in one round trip when warm; the misses in one batch call.
func ExampleGetMany() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-page", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	table := map[string]Product{"1": {ID: "1", Price: 100}, "2": {ID: "2", Price: 200}, "3": {ID: "3", Price: 300}}
	batches := 0
	findProducts := func(ctx context.Context, ids []string) (map[string]Product, error) { // WHERE id IN (...)
		batches++
		out := map[string]Product{}
		for _, id := range ids {
			if p, ok := table[id]; ok {
				out[id] = p
			}
		}
		return out, nil
	}
	page, _ := guard.GetMany(ctx, g, []string{"1", "2", "3", "404"}, findProducts)
	fmt.Println(len(page), page["2"].Price, "batches:", batches)
	page, _ = guard.GetMany(ctx, g, []string{"1", "2", "3", "404"}, findProducts) // all cached now ("404" as a marker)
	fmt.Println(len(page), page["3"].Price, "batches:", batches)
	// Output:
	// 3 200 batches: 1
	// 3 300 batches: 1
}

// ExampleOptions_openTelemetry turns on spans and metrics with the
// application's OpenTelemetry SDK (here an in-memory span recorder and a
// manual metric reader; in an application, the providers that export to
// the collector, or otel.GetTracerProvider() and otel.GetMeterProvider()).
func ExampleOptions_openTelemetry() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer tp.Shutdown(ctx)
	defer mp.Shutdown(ctx)

	g, err := guard.New(ctx, rdb, "example-otel", &guard.Options{Telemetry: guard.TelemetryOptions{TracerProvider: tp, MeterProvider: mp}})
	if err != nil {
		panic(err)
	}
	defer g.Close()
	_, _ = g.Rebuild(ctx, func(yield func(string, error) bool) { yield("42", nil) }, nil)
	load := func(ctx context.Context, id string) (string, error) { return "Desk lamp", nil }
	for _, id := range []string{"42", "42", "7"} {
		_, _ = guard.Get(ctx, g, id, load)
	}

	for _, s := range spans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "cacheguard.outcome" {
				fmt.Println(s.Name(), a.Value.AsString())
			}
		}
	}
	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "cacheguard.gets" {
				var n int64
				for _, p := range sum.DataPoints {
					n += p.Value
				}
				fmt.Println(m.Name, n)
			}
		}
	}
	// Output:
	// cacheguard.Get miss
	// cacheguard.Get hit
	// cacheguard.Get reject
	// cacheguard.gets 3
}

// New with options: the sizing and the ID source of the filter, and the
// logger. With Filter.IDs the filter is built in the background and again
// whenever Redis loses it; bad options are refused.
func ExampleNew() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	ids := []string{"a", "b", "c"}
	g, err := guard.New(ctx, rdb, "example-new", &guard.Options{
		TTL:    time.Hour,
		Logger: slog.New(slog.DiscardHandler), // default: slog.Default()
		Filter: guard.FilterOptions{
			ExpectedItems: 10_000,
			IDs:           func(context.Context) iter.Seq2[string, error] { return guard.IDs(ids) },
		},
	})
	if err != nil {
		panic(err)
	}
	defer g.Close()
	for !filterReady(ctx, g) {
		time.Sleep(10 * time.Millisecond) // built in the background; an example has no test helper to poll with
	}
	ok, _ := g.MayExist(ctx, "zz")
	fmt.Println("zz may exist:", ok)

	_, err = guard.New(ctx, rdb, "bad name!", nil)
	fmt.Println(errors.Is(err, guard.ErrInvalidOptions))
	// Output:
	// zz may exist: false
	// true
}

func filterReady(ctx context.Context, g *guard.Guard) bool {
	in, err := g.Info(ctx)
	return err == nil && in.Ready
}

// Rebuild from a slice (guard.IDs), then Set and Delete after writes to
// the source of truth.
func ExampleGuard_Rebuild() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-rebuild", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	n, err := g.Rebuild(ctx, guard.IDs([]string{"1", "2", "3"}), nil)
	fmt.Println(n, err)

	load := func(ctx context.Context, id string) (string, error) { return "row " + id, nil }
	_ = guard.Set(ctx, g, "2", "row 2, updated") // UPDATE committed: write the new value through
	v, _ := guard.Get(ctx, g, "2", load)
	fmt.Println(v)
	_ = g.Delete(ctx, "3") // DELETE committed: "not found" everywhere, without a load
	_, err = guard.Get(ctx, g, "3", load)
	fmt.Println(errors.Is(err, guard.ErrNotFound))
	// Output:
	// 3 <nil>
	// row 2, updated
	// true
}

// Peek is a Get's read alone, for middleware: it answers "does not exist"
// for IDs the filter never saw, and the Get that follows on its ctx reuses
// the read.
func ExampleGuard_Peek() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-peek", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, guard.IDs([]string{"7"}), nil); err != nil {
		panic(err)
	}
	_, exists, _ := g.Peek(ctx, "8")
	fmt.Println("8 exists:", exists)
	pctx, exists, _ := g.Peek(ctx, "7")
	v, _ := guard.Get(pctx, g, "7", func(ctx context.Context, id string) (string, error) { return "row " + id, nil })
	fmt.Println("7 exists:", exists, v)
	// Output:
	// 8 exists: false
	// 7 exists: true row 7
}

// Example_service is docs/usage.md's service, in the order the page
// builds it: the client, the Guard with its ID source in SQL and a local
// copy, the cached repository call, the writes after each commit, and the
// middleware. It is compiled, not run: it needs a database.
func Example_service() {
	ctx := context.Background()
	var db *sql.DB // sql.Open("pgx", os.Getenv("DATABASE_URL")), for one
	logger := slog.Default()
	redis.SetLogger(guard.RedisLogger(logger)) // go-redis's own lines, limited as the Guard's are

	rdb := redis.NewClient(&redis.Options{
		Addr:                  "redis.internal:6379",
		Username:              "app", // the service's Redis user (docs/usage.md)
		Password:              os.Getenv("REDIS_PASSWORD"),
		ContextTimeoutEnabled: true, // a frozen Redis cannot hold a Get past its ctx deadline
		DialerRetries:         1,    // nor can dial retries while Redis is down
		MaxRetries:            -1,   // the guard loads through instead of retrying
	})
	g, err := guard.New(ctx, rdb, "product", &guard.Options{
		Filter: guard.FilterOptions{
			ExpectedItems: 2_000_000, // room for the rows you will have
			IDs: func(ctx context.Context) iter.Seq2[string, error] { // rebuilt from it whenever Redis loses it
				return guard.Rows(db.QueryContext(ctx, "SELECT id FROM products"))
			},
		},
		Local:  &guard.LocalOptions{}, // hot reads from memory: 10,000 values, 1 s each
		Logger: logger,
	})
	if err != nil {
		log.Fatal(err) // only bad options: New does not need Redis to be up
	}
	defer g.Close()

	products, err := guard.For(g, func(ctx context.Context, id string) (Product, error) {
		var p Product
		err := db.QueryRowContext(ctx, "SELECT id, name, price FROM products WHERE id = $1", id).Scan(&p.ID, &p.Name, &p.Price)
		if errors.Is(err, sql.ErrNoRows) {
			return Product{}, guard.ErrNotFound // cached as a "not found" marker
		}
		return p, err // any other error: returned, nothing cached
	})
	if err != nil {
		log.Fatal(err)
	}

	// After the UPDATE commits: write the new value through.
	p := Product{ID: "42", Name: "Desk lamp", Price: 2499}
	if err := products.Set(ctx, p.ID, p); err != nil {
		log.Print(err) // ErrUnavailable: replayed by the Guard when Redis answers
	}

	mux := http.NewServeMux()
	mux.Handle("GET /products/{id}", nethttp.Middleware(g, nil)(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), 200*time.Millisecond)
			defer cancel()
			p, err := products.Get(ctx, r.PathValue("id"))
			if err != nil {
				nethttp.Error(w, r, err) // 404, 400, 503 with Retry-After, or 500
				return
			}
			fmt.Fprintf(w, "%s %d\n", p.Name, p.Price)
		})))
	log.Fatal(http.ListenAndServe(":8080", mux))
}
