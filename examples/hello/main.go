// Command hello is the README's example: a product service's reads behind
// cacheguard, its writes telling the guard, and the HTTP middleware that
// turns unknown IDs away. REDIS_ADDR names the server (localhost:6379).
package main

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
)

type Product struct {
	ID    string
	Name  string
	Price int
}

// db stands for the database: the source of truth, safe for concurrent use.
var db = struct {
	sync.RWMutex
	rows map[string]Product
}{rows: map[string]Product{"1": {"1", "Desk lamp", 1999}, "2": {"2", "Chair", 4900}}}

// productIDs lists every product ID: the guard builds its bloom filter from
// it, and builds it again whenever Redis loses it. From database/sql, streamed:
// return guard.Rows(sqlDB.QueryContext(ctx, "SELECT id FROM products"))
func productIDs(ctx context.Context) iter.Seq2[string, error] {
	db.RLock()
	defer db.RUnlock()
	return guard.IDs(slices.Collect(maps.Keys(db.rows)))
}

func findProduct(ctx context.Context, id string) (Product, error) {
	db.RLock()
	p, ok := db.rows[id] // SELECT ... WHERE id = $1
	db.RUnlock()
	if !ok {
		return Product{}, guard.ErrNotFound // sql.ErrNoRows becomes "not found"
	}
	return p, nil
}

func main() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "localhost:6379"
	}
	if err := run(context.Background(), addr); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr string) error {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true, // a frozen Redis cannot hold a Get past its ctx deadline
		DialerRetries:         1,    // nor can dial retries while Redis is down
		MaxRetries:            -1,   // the guard loads through instead of retrying
	})
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "product", &guard.Options{Filter: guard.FilterOptions{IDs: productIDs}})
	if err != nil {
		return err
	}
	defer g.Close()
	products, err := guard.For(g, findProduct) // findProduct, now cached
	if err != nil {
		return err
	}

	p, err := products.Get(ctx, "1") // a miss: loaded once across processes, then cached
	fmt.Println(p.Name, err)
	_, err = products.Get(ctx, "999") // the filter answers: the database is not asked
	fmt.Println(errors.Is(err, guard.ErrNotFound))

	// After each write to the database commits. A write that cannot reach
	// Redis returns its error and is replayed: this process loads the ID
	// through until it lands.
	shelf := Product{"3", "Shelf", 2900}
	commit(func(rows map[string]Product) { rows["3"] = shelf })
	if err := products.Set(ctx, "3", shelf); err != nil { // INSERT or UPDATE: written through, the ID added to the filter
		log.Print(err)
	}
	commit(func(rows map[string]Product) { delete(rows, "2") })
	if err := products.Delete(ctx, "2"); err != nil { // DELETE: "not found" everywhere at once
		log.Print(err)
	}

	// HTTP: unknown IDs get 404 before the handler runs.
	mux := http.NewServeMux()
	mux.Handle("GET /products/{id}", nethttp.Middleware(g, nil)(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) { // the deadline belongs here: the middleware bounds itself
			ctx, cancel := context.WithTimeout(r.Context(), 200*time.Millisecond)
			defer cancel()
			p, err := products.Get(ctx, r.PathValue("id"))
			if err != nil {
				nethttp.Error(w, r, err) // 404, 400, 503 or 500
				return
			}
			fmt.Fprintf(w, "%s %d\n", p.Name, p.Price)
		})))
	for _, id := range []string{"1", "2", "3", "999"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/products/"+id, nil))
		fmt.Println(id, rec.Code)
	}
	return nil
}

// commit stands for a committed transaction.
func commit(write func(rows map[string]Product)) {
	db.Lock()
	defer db.Unlock()
	write(db.rows)
}
