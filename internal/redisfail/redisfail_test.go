package redisfail_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisfail"
)

func TestWrap(t *testing.T) {
	if redisfail.Wrap(nil) != nil {
		t.Fatal("Wrap(nil) != nil")
	}
	if err := redisfail.Wrap(redis.Nil); err != redis.Nil {
		t.Fatalf("Wrap(redis.Nil) = %v, want redis.Nil itself", err)
	}
	base := errors.New("dial tcp: connection refused")
	once := redisfail.Wrap(base)
	if !errors.Is(once, redisfail.ErrUnavailable) || !errors.Is(once, base) {
		t.Fatalf("Wrap(%v) = %v: must wrap both", base, once)
	}
	if twice := redisfail.Wrap(once); twice != once {
		t.Fatalf("wrapped twice: %v", twice)
	}
	if err := redisfail.Wrap(context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, redisfail.ErrUnavailable) {
		t.Fatalf("a deadline while waiting for Redis: %v", err)
	}
}

// reply is an error reply as go-redis returns it (redis.Error).
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

// TestRefused: the command an ACL refused, from a NOPERM reply, and from
// the line of a script Redis names (as Redis 7.0 words both; 7.2 names the
// command inside a script itself).
func TestRefused(t *testing.T) {
	script := "-- a script\nlocal v = redis.call('GET', KEYS[1])\nreturn redis.call('HMGET', KEYS[1], 'a')\n"
	sha := "ERR The user executing the script can't run this command or subcommand script: %s, on @user_script:%d."
	for _, c := range []struct {
		err  error
		want string
	}{
		{reply("NOPERM this user has no permissions to run the 'hget' command"), "hget"},
		{redisfail.Wrap(reply("NOPERM this user has no permissions to run the 'memory|usage' command")), "memory|usage"},
		{reply(fmt.Sprintf(sha, shaOf(script), 3)), "hmget"},
		{reply("ERR ACL failure in script: User app has no permissions to run the 'hmget' command script: " + shaOf(script) +
			", on @user_script:3."), "hmget"}, // Redis 7.2's words
		{reply(fmt.Sprintf(sha, shaOf(script), 1)), "a command of the script on line 1"},
		{reply(fmt.Sprintf(sha, shaOf("other"), 3)), "a command of script " + shaOf("other")},
		{reply("OOM command not allowed when used memory > 'maxmemory'"), ""},
		{errors.New("NOPERM but not a reply"), ""},
		{nil, ""},
	} {
		if got := redisfail.Refused(c.err, script); got != c.want {
			t.Errorf("Refused(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func shaOf(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}
