package main

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/pgserver"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// startPostgres runs a private PostgreSQL server (package pgserver) and
// returns the URL of a fresh database "shop" on it.
func startPostgres(t *testing.T) string {
	t.Helper()
	srv, err := pgserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Remove)
	db, err := sql.Open("pgx", srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE shop"); err != nil {
		t.Fatal(err)
	}
	return srv.URL("shop")
}

// TestProductLifecyclePostgres runs the CRUD cycle on PostgreSQL, the store
// DATABASE_URL selects.
func TestProductLifecyclePostgres(t *testing.T) {
	ctx := context.Background()
	url := startPostgres(t)
	srv, err := redisserver.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	db, err := openStore(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := seed(ctx, db, 1000, 100); err != nil {
		t.Fatal(err)
	}
	shop, err := newShop(ctx, db, srv.Options(), 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(shop.Handler(5))
	t.Cleanup(func() { hs.Close(); shop.Close() })
	lifecycle(t, shop, hs)
}
