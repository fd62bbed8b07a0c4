package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL, when DATABASE_URL is set
	_ "modernc.org/sqlite"             // embedded SQLite (pure Go), by default

	"github.com/cacheguard/cacheguard/guard"
)

// Product and User are the shop's rows.
type Product struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	PriceCents int64  `json:"price_cents"`
}

type User struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Email string `json:"email"`
}

// Store is the source of truth. Every query it runs is counted.
type Store struct {
	db      *sql.DB
	latency time.Duration // added to every query: a networked database's round trip
	queries atomic.Int64
}

// openStore opens PostgreSQL when dsn is a postgres:// URL, SQLite otherwise
// (dsn is then a file path).
func openStore(ctx context.Context, dsn string) (*sql.DB, error) {
	var db *sql.DB
	var err error
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if db, err = sql.Open("pgx", dsn); err != nil {
			return nil, err
		}
		// Keep connections: database/sql keeps 2 idle by default, and a
		// PostgreSQL connection takes milliseconds to open.
		db.SetMaxOpenConns(32)
		db.SetMaxIdleConns(32)
		_, err = db.ExecContext(ctx, `
			CREATE TABLE IF NOT EXISTS products (id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL, price_cents BIGINT NOT NULL);
			CREATE TABLE IF NOT EXISTS users (id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL)`)
	} else {
		if db, err = sql.Open("sqlite", "file:"+dsn+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)"); err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(8)
		db.SetMaxIdleConns(8)
		_, err = db.ExecContext(ctx, `
			CREATE TABLE IF NOT EXISTS products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL);
			CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL)`)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("schema: %w", err)
	}
	return db, nil
}

// seed fills empty tables with products and users.
func seed(ctx context.Context, db *sql.DB, products, users int) error {
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM products`).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	p, err := tx.PrepareContext(ctx, `INSERT INTO products (name, price_cents) VALUES ($1, $2)`)
	if err != nil {
		return err
	}
	for i := 1; i <= products; i++ {
		if _, err := p.ExecContext(ctx, "Product "+strconv.Itoa(i), 100+i%9900); err != nil {
			return err
		}
	}
	u, err := tx.PrepareContext(ctx, `INSERT INTO users (name, email) VALUES ($1, $2)`)
	if err != nil {
		return err
	}
	for i := 1; i <= users; i++ {
		if _, err := u.ExecContext(ctx, "User "+strconv.Itoa(i), "user"+strconv.Itoa(i)+"@example.com"); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func (s *Store) query(ctx context.Context) error {
	s.queries.Add(1)
	if s.latency > 0 {
		t := time.NewTimer(s.latency)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Product returns a product, or an error wrapping sql.ErrNoRows.
func (s *Store) Product(ctx context.Context, id string) (Product, error) {
	if err := s.query(ctx); err != nil {
		return Product{}, err
	}
	var p Product
	err := s.db.QueryRowContext(ctx, `SELECT id, name, price_cents FROM products WHERE id = $1`, id).Scan(&p.ID, &p.Name, &p.PriceCents)
	if err != nil {
		return Product{}, fmt.Errorf("product %s: %w", id, err)
	}
	return p, nil
}

func (s *Store) User(ctx context.Context, id string) (User, error) {
	if err := s.query(ctx); err != nil {
		return User{}, err
	}
	var u User
	err := s.db.QueryRowContext(ctx, `SELECT id, name, email FROM users WHERE id = $1`, id).Scan(&u.ID, &u.Name, &u.Email)
	if err != nil {
		return User{}, fmt.Errorf("user %s: %w", id, err)
	}
	return u, nil
}

func (s *Store) CreateProduct(ctx context.Context, name string, price int64) (Product, error) {
	if err := s.query(ctx); err != nil {
		return Product{}, err
	}
	var id int64
	err := s.db.QueryRowContext(ctx, `INSERT INTO products (name, price_cents) VALUES ($1, $2) RETURNING id`, name, price).Scan(&id)
	return Product{ID: strconv.FormatInt(id, 10), Name: name, PriceCents: price}, err
}

// UpdateProduct returns sql.ErrNoRows when there is no such product.
func (s *Store) UpdateProduct(ctx context.Context, p Product) error {
	return s.exec(ctx, `UPDATE products SET name = $1, price_cents = $2 WHERE id = $3`, p.Name, p.PriceCents, p.ID)
}

func (s *Store) DeleteProduct(ctx context.Context, id string) error {
	return s.exec(ctx, `DELETE FROM products WHERE id = $1`, id)
}

func (s *Store) exec(ctx context.Context, q string, args ...any) error {
	if err := s.query(ctx); err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return sql.ErrNoRows
	}
	return nil
}

// IDs lists every id of a table, for bloom filter rebuilds.
func (s *Store) IDs(ctx context.Context, table string) iter.Seq2[string, error] {
	if table != "products" && table != "users" {
		return guard.Rows[*sql.Rows](nil, errors.New("unknown table"))
	}
	return guard.Rows(s.db.QueryContext(ctx, `SELECT id FROM `+table))
}
