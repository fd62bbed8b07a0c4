package redisserver_test

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

func TestStartKillRestartStop(t *testing.T) {
	ctx := context.Background()
	s, err := redisserver.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Network: s.Network, Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	pid := s.PID()
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("server still answers after Kill")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.PID() == pid {
		t.Fatal("Restart kept the old process")
	}
	// Same address, and persistence is off: the key is gone.
	if err := c.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("after restart GET = %v, want redis.Nil", err)
	}
	dir := s.Dir
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("Stop left %s behind", dir)
	}
}

func TestTCPPort(t *testing.T) {
	port, err := redisserver.FreePort(true)
	if err != nil {
		t.Fatal(err)
	}
	s, err := redisserver.Start(context.Background(), &redisserver.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	c := redis.NewClient(s.Options())
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if s.Network != "tcp" {
		t.Fatalf("network %s", s.Network)
	}
}
