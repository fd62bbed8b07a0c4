package redisserver

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a real Redis Cluster of redis-server processes on loopback TCP
// ports, created with `redis-cli --cluster create`.
type Cluster struct {
	Nodes []*Server // masters first, as redis-cli assigned them
}

// StartCluster starts masters × (1 + replicas) servers with cluster mode on
// and joins them into a cluster (node timeout 2 s, so failover is quick), and
// waits until every node reports cluster_state:ok. args are more
// redis-server arguments for every node (ACL users, say).
func StartCluster(ctx context.Context, masters, replicas int, args ...string) (*Cluster, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redisserver: redis-cli not found on PATH (apt-get install -y redis-tools): %w", err)
	}
	c := &Cluster{}
	var addrs []string
	for range masters * (1 + replicas) {
		port, err := FreePort(true)
		if err != nil {
			c.Stop()
			return nil, err
		}
		s, err := Start(ctx, &Options{Port: port, Args: append([]string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no",
			// Replicas sync at once (the default waits 5 s for more
			// replicas); a replica that never synced cannot fail over.
			"--repl-diskless-sync-delay", "0",
			// A master pings its replicas every second (the default is
			// 10): CLUSTER SLOTS lists a replica only once its offset has
			// moved from 0, and WaitHealthy waits for that.
			"--repl-ping-replica-period", "1",
		}, args...)})
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	create := append([]string{"--cluster", "create"}, addrs...)
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, create...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redisserver: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Addrs returns the node addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// Options returns go-redis cluster options for this cluster.
func (c *Cluster) Options() *redis.ClusterOptions {
	return &redis.ClusterOptions{Addrs: c.Addrs()}
}

// WaitHealthy waits until every live node reports cluster_state:ok with all
// 16384 slots served, every live replica's link to its master is up, and
// every live node's CLUSTER SLOTS names every live node. That last one
// makes a cluster client's view the same whichever node it asks: right
// after the cluster forms, a node may not list a replica yet (Redis 7
// leaves out of CLUSTER SLOTS a replica that has not synced, and gossip
// takes a moment), and a client that reloads its view in between sees
// nodes come and go (internal/cputime's sum over them went down once).
func (c *Cluster) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok := true
		var live []*Server
		for _, n := range c.Nodes {
			if n.PID() != 0 && !n.exited() {
				live = append(live, n)
			}
		}
		for _, n := range live {
			cl := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
			info, err := cl.ClusterInfo(ctx).Result()
			repl, rerr := cl.Info(ctx, "replication").Result()
			slots, serr := cl.ClusterSlots(ctx).Result()
			_ = cl.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				ok, last = false, fmt.Sprintf("%s: %v %s", n.Addr, err, info)
				break
			}
			if rerr != nil || (strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up")) {
				ok, last = false, fmt.Sprintf("%s: replica not in sync: %v", n.Addr, rerr)
				break
			}
			if named := slotsNodes(slots); serr != nil || named < len(live) {
				ok, last = false, fmt.Sprintf("%s: CLUSTER SLOTS names %d of %d live nodes: %v", n.Addr, named, len(live), serr)
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisserver: cluster not healthy after %v: %s", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Masters returns the nodes that currently serve slots as masters.
func (c *Cluster) Masters(ctx context.Context) ([]*Server, error) {
	var out []*Server
	for _, n := range c.Nodes {
		if n.exited() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
		role, err := cl.Do(ctx, "ROLE").Slice()
		_ = cl.Close()
		if err != nil {
			return nil, fmt.Errorf("redisserver: ROLE on %s: %w", n.Addr, err)
		}
		if len(role) > 0 && role[0] == "master" {
			out = append(out, n)
		}
	}
	return out, nil
}

// Stop stops every node.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		_ = n.Stop()
	}
}

// slotsNodes counts the distinct nodes a CLUSTER SLOTS answer names.
func slotsNodes(slots []redis.ClusterSlot) int {
	seen := map[string]bool{}
	for _, r := range slots {
		for _, n := range r.Nodes {
			seen[n.Addr] = true
		}
	}
	return len(seen)
}
