package faults_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/testcert"
)

// TestTLS: redis-server serving TLS only on its port (certificates made by
// the test), and the whole API over it, the local cache's pub/sub included.
func TestTLS(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pool := testcert.Write(t, dir)
	port, err := redisserver.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redisserver.Start(ctx, &redisserver.Options{Args: []string{
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", filepath.Join(dir, "server.crt"), "--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"), "--tls-auth-clients", "no",
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	plain := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("a plain-text client got an answer on the TLS port: the test would not prove TLS")
	}
	opts := clientOptions("tcp", addr)
	opts.TLSConfig = &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	rdb := redis.NewClient(opts)
	defer rdb.Close()

	src := newSource()
	gopts := guardOptions(src)
	gopts.Local = &guard.LocalOptions{}
	g, err := guard.New(ctx, rdb, "product", gopts)
	if err != nil {
		t.Fatalf("New over TLS: %v", err)
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, src.ids(ctx), nil); err != nil {
		t.Fatal(err)
	}
	products, err := guard.For(g, src.load)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		run  func() error
	}{
		{"Get (miss)", func() error { return expect(products.Get(ctx, "p7"))(7) }},
		{"Get (hit)", func() error { return expect(products.Get(ctx, "p7"))(7) }},
		{"Get (bloom reject)", func() error { return notFound(products.Get(ctx, "nope")) }},
		{"Peek", func() error { _, ok, err := g.Peek(ctx, "p8"); return errIf(err, !ok, "Peek(p8) = false") }},
		{"MayExist", func() error { ok, err := g.MayExist(ctx, "nope"); return errIf(err, ok, "MayExist(nope) = true") }},
		{"Add", func() error {
			src.mu.Lock()
			src.rows["fresh"] = 5000
			src.mu.Unlock()
			if err := products.Add(ctx, "fresh"); err != nil {
				return err
			}
			return expect(products.Get(ctx, "fresh"))(5000)
		}},
		{"Set", func() error {
			src.mu.Lock()
			src.rows["fresh"] = 5001 // UPDATE committed
			src.mu.Unlock()
			if err := products.Set(ctx, "fresh", 5001); err != nil {
				return err
			}
			return expect(products.Get(ctx, "fresh"))(5001)
		}},
		{"Delete", func() error {
			src.mu.Lock()
			delete(src.rows, "fresh") // DELETE committed
			src.mu.Unlock()
			if err := products.Delete(ctx, "fresh"); err != nil {
				return err
			}
			return notFound(products.Get(ctx, "fresh"))
		}},
		{"Invalidate", func() error {
			if err := products.Invalidate(ctx, "p8"); err != nil {
				return err
			}
			return expect(products.Get(ctx, "p8"))(8)
		}},
		{"Info", func() error {
			in, err := g.Info(ctx)
			return errIf(err, !in.Ready, "Info: filter not ready")
		}},
	}
	for _, s := range steps {
		if err := s.run(); err != nil {
			t.Fatalf("%s over TLS: %v", s.name, err)
		}
	}
	if st := g.Stats(); st.RedisErrors != 0 || st.LoadThroughs != 0 {
		t.Fatalf("over TLS: %+v", st)
	}
	// And traffic, with the figures of the other scenarios.
	tr := startTraffic(g, src)
	time.Sleep(time.Second)
	tr.halt()
	record(row{Scenario: "TLS (no fault): the full API and traffic", Gets: tr.gets.Load(), Wrong: tr.wrong.Load(),
		FalseNotFound: tr.falseNF.Load(), Fails: tr.fails.Load(), MaxLatency: time.Duration(tr.maxLatency.Load())})
	if tr.wrong.Load() != 0 || tr.falseNF.Load() != 0 || tr.fails.Load() != 0 {
		t.Fatalf("traffic over TLS: %d wrong, %d false not-found, %d failed", tr.wrong.Load(), tr.falseNF.Load(), tr.fails.Load())
	}
}

func expect(v int, err error) func(want int) error {
	return func(want int) error {
		if err != nil {
			return err
		}
		return errIf(nil, v != want, "got "+strconv.Itoa(v)+", want "+strconv.Itoa(want))
	}
}

func notFound(_ int, err error) error {
	if errors.Is(err, guard.ErrNotFound) {
		return nil
	}
	return errIf(err, true, "want ErrNotFound")
}

func errIf(err error, bad bool, msg string) error {
	if err != nil {
		return err
	}
	if bad {
		return errors.New(msg)
	}
	return nil
}
