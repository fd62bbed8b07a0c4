package keyspace

import "strings"

// The least-privilege Redis user of each component, for a KeyPrefix: its
// keys and channels are "<prefix>:*", and its commands are those it sends,
// directly or from its Lua scripts (Redis checks those too). One is
// @dangerous: INFO, read-only, which a Guard reads at connect to warn of an
// allkeys-* eviction policy (refused, it says once that it cannot tell).
// docs/usage.md shows these lines (TestACLDoc compares
// them), and each component's tests run their whole life under its user,
// incidents included, with ACL LOG checked for refusals.
const (
	// ACLService is a service's Guard: every entry point, the automatic
	// rebuild, the local copy's invalidations and pub/sub's health check
	// (PING), the watcher of lost writes and its replay (SCAN), Info
	// (BITCOUNT, GETBIT, MEMORY USAGE).
	ACLService = "+get +set +del +unlink +exists +pexpire +pttl +time +ping +publish +subscribe " +
		"+info +eval +evalsha +script|load +getrange +setrange +bitfield +bitop +bitcount +getbit " +
		"+hget +hmget +hset +hdel +hexists +hgetall +hincrby +hkeys +incr +scan +memory|usage"
	// ACLFollower is cacheguard-pgfollow: a Guard's writes (no load, no
	// subscription; Delete's script reads the entry's fields, HKEYS) and
	// rebuild, dropping every entry after a reset (SCAN), its position and
	// the inspector's reads (TIME), Info (MEMORY USAGE).
	ACLFollower = "+get +set +del +unlink +exists +pexpire +pttl +time +publish +info " +
		"+eval +evalsha +script|load +getrange +setrange +bitfield +bitop +bitcount +getbit " +
		"+hget +hset +hdel +hexists +hgetall +hincrby +hkeys +incr +scan +memory|usage"
	// ACLCommand is the cacheguard command: info, rebuild, check, get and
	// invalidate, which registers the IDs in the filter as Add does
	// (HINCRBY of its count); no load, no subscription.
	ACLCommand = "+get +set +del +unlink +exists +pexpire +pttl +publish +info " +
		"+eval +evalsha +script|load +getrange +setrange +bitfield +bitop +bitcount +getbit " +
		"+hget +hset +hdel +hexists +hgetall +hincrby +incr +memory|usage"
	// ACLCluster is added on a Redis Cluster: the client reads the slot map
	// and the commands' key positions (COMMAND; refused, it asks again at
	// every command).
	ACLCluster = "+cluster|slots +command"
)

// ACLRule is the ACL SETUSER arguments (after the user name and password)
// that limit a user to prefix's keys and channels and to cmds.
func ACLRule(prefix, cmds string) []string {
	return append([]string{"resetkeys", "~" + prefix + ":*", "resetchannels", "&" + prefix + ":*", "-@all"}, strings.Fields(cmds)...)
}

// ACLSetUser is the ACL SETUSER command that creates user for prefix with
// cmds, as docs/usage.md shows it: its commands wrapped at 80 columns.
func ACLSetUser(user, prefix, cmds string) string {
	rule := ACLRule(prefix, cmds)
	var b strings.Builder
	b.WriteString("ACL SETUSER " + user + " on >secret " + strings.Join(rule[:5], " "))
	line := 80
	for _, c := range rule[5:] {
		if line+1+len(c) > 80 {
			b.WriteString("\n   ")
			line = 3
		}
		b.WriteString(" " + c)
		line += 1 + len(c)
	}
	return b.String()
}
