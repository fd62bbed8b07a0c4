package pgfollow_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// A row updated straight in the database (by psql, a migration, another
// service) reaches the Guard: the follower invalidates the cached row.
func Example() {
	ctx := context.Background()
	url := os.Getenv(envPG) // a PostgreSQL with wal_level = logical, as a REPLICATION role
	db, _ := pgxpool.New(ctx, url)
	defer db.Close()
	db.Exec(ctx, "CREATE TABLE products (id text PRIMARY KEY, price int)")
	db.Exec(ctx, "INSERT INTO products VALUES ('p1', 100)")

	var rdb redis.UniversalClient = redistest.NewClient() // in an application: redis.NewClient(...)
	defer rdb.Close()
	g, _ := guard.New(ctx, rdb, "product", &guard.Options{KeyPrefix: "example"})
	defer g.Close()
	load := func(ctx context.Context, id string) (int, error) {
		var price int
		err := db.QueryRow(ctx, "SELECT price FROM products WHERE id = $1", id).Scan(&price)
		return price, err
	}

	tables := []pgfollow.Table{{Name: "products", Guard: g}}
	if err := pgfollow.Setup(ctx, url, nil, "products"); err != nil { // the publication and the slot, once
		fmt.Println(err)
		return
	}
	defer pgfollow.DropSlot(ctx, url, "cacheguard")
	f, _ := pgfollow.New(url, tables, nil)
	run, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(run) }() // in a sidecar: cacheguard-pgfollow -table products=product
	defer func() { stop(); <-done }()

	before, _ := guard.Get(ctx, g, "p1", load)
	db.Exec(ctx, "UPDATE products SET price = 120 WHERE id = 'p1'")
	for f.Stats().Changes == 0 { // applied: the cached 100 is gone
		time.Sleep(time.Millisecond)
	}
	after, _ := guard.Get(ctx, g, "p1", load)
	fmt.Println(before, after)
	// Output: 100 120
}
