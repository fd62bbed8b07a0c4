package redisserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoSentinel is returned when the redis-sentinel binary cannot be found.
var ErrNoSentinel = errors.New("redisserver: redis-sentinel not found on PATH (install it: apt-get install -y redis-sentinel, or run `make test`, which does)")

// Replicated is a master, its replicas and the Sentinels that watch them, all
// on loopback TCP ports.
type Replicated struct {
	Name      string // the master's name in the Sentinels
	Master    *Server
	Replicas  []*Server
	Sentinels []*Server
}

// StartReplicated starts a master, replicas that replicate it, and sentinels
// Sentinels (quorum: a majority) that fail it over one second after it stops
// answering, and waits until every Sentinel knows every replica.
func StartReplicated(ctx context.Context, name string, replicas, sentinels int) (*Replicated, error) {
	if _, err := exec.LookPath("redis-sentinel"); err != nil { // before any server is started
		return nil, ErrNoSentinel
	}
	r := &Replicated{Name: name}
	start := func(o *Options) (*Server, error) {
		port, err := FreePort(false)
		if err != nil {
			return nil, err
		}
		o.Port = port
		return Start(ctx, o)
	}
	// Replicas sync at once (the default waits 5 s for more replicas).
	fast := []string{"--repl-diskless-sync-delay", "0"}
	var err error
	if r.Master, err = start(&Options{Args: fast}); err != nil {
		return nil, err
	}
	for range replicas {
		s, err := start(&Options{Args: append(fast, "--replicaof", "127.0.0.1", r.Master.Port())})
		if err != nil {
			r.Stop()
			return nil, err
		}
		r.Replicas = append(r.Replicas, s)
	}
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %s %d\n", name, r.Master.Port(), sentinels/2+1) +
		fmt.Sprintf("sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n", name, name)
	for range sentinels {
		s, err := start(&Options{Sentinel: conf})
		if err != nil {
			r.Stop()
			return nil, err
		}
		r.Sentinels = append(r.Sentinels, s)
	}
	if err := r.waitKnown(ctx, replicas, 30*time.Second); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

// SentinelAddrs are the Sentinels' addresses, for redis.FailoverOptions.
func (r *Replicated) SentinelAddrs() []string {
	addrs := make([]string, len(r.Sentinels))
	for i, s := range r.Sentinels {
		addrs[i] = s.Addr
	}
	return addrs
}

// waitKnown waits until every Sentinel reports replicas replicas and the
// other Sentinels of the master.
func (r *Replicated) waitKnown(ctx context.Context, replicas int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, s := range r.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
		for {
			m, err := c.Master(ctx, r.Name).Result()
			if err == nil && m["num-slaves"] == strconv.Itoa(replicas) && m["num-other-sentinels"] == strconv.Itoa(len(r.Sentinels)-1) {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				return fmt.Errorf("redisserver: sentinel %s does not know the set after %v: %v %v", s.Addr, within, m, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return nil
}

// Stop stops every process.
func (r *Replicated) Stop() {
	for _, s := range append(append(r.Sentinels, r.Replicas...), r.Master) {
		if s != nil {
			_ = s.Stop()
		}
	}
}

// Port is the server's TCP port ("" on a unix socket).
func (s *Server) Port() string {
	if s.Network != "tcp" {
		return ""
	}
	return strconv.Itoa(s.opts.Port)
}

// launchSentinel writes the Sentinel's configuration (it rewrites the file
// as it learns the set) and starts redis-sentinel on it.
func (s *Server) launchSentinel(ctx context.Context) error {
	bin, err := exec.LookPath("redis-sentinel")
	if err != nil {
		return ErrNoSentinel
	}
	conf := filepath.Join(s.Dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(s.opts.Sentinel), 0o600); err != nil {
		return fmt.Errorf("redisserver: %w", err)
	}
	return s.run(ctx, bin, []string{conf, "--port", s.Port(), "--bind", "127.0.0.1", "--protected-mode", "no",
		"--dir", s.Dir, "--logfile", filepath.Join(s.Dir, "redis.log"), "--daemonize", "no"})
}
