// Package redisfail owns the one sentinel that every Redis failure in
// cacheguard wraps, whatever package it surfaces from (guard, bloom, lock,
// loader): a caller writes a single errors.Is(err, guard.ErrUnavailable)
// branch, and the sentinel re-exported by guard, bloom and lock is this one
// value.
//
// A Redis failure is anything but an answer: a dial or I/O error, a timeout
// or a cancelled context while waiting for Redis, and an error reply (OOM
// under maxmemory, NOPERM from an ACL, READONLY, CLUSTERDOWN, ...). redis.Nil
// is an answer ("no such key") and is never wrapped.
package redisfail

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable is wrapped by every error caused by Redis failing to answer.
var ErrUnavailable = errors.New("cacheguard: redis unavailable")

// Wrap returns err wrapping ErrUnavailable (and still wrapping err). nil,
// redis.Nil and errors that already wrap ErrUnavailable come back unchanged.
func Wrap(err error) error {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// Refused names the command an ACL refused in err ("" if err is no such
// refusal): the one a NOPERM reply names, or, for a command a Lua script
// ran (Redis names only the script's SHA1 and line), the one that line of
// whichever of scripts has that SHA1 calls.
func Refused(err error, scripts ...string) string {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return ""
	}
	msg := re.Error()
	if m := noperm.FindStringSubmatch(msg); m != nil {
		return strings.ToLower(m[1])
	}
	if m := inScript72.FindStringSubmatch(msg); m != nil { // Redis 7.2 and later, Valkey
		return strings.ToLower(m[1])
	}
	m := inScript.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	line, _ := strconv.Atoi(m[2])
	for _, src := range scripts {
		if sum := sha1.Sum([]byte(src)); hex.EncodeToString(sum[:]) != m[1] {
			continue
		}
		if lines := strings.Split(src, "\n"); line >= 1 && line <= len(lines) {
			if c := luaCall.FindStringSubmatch(lines[line-1]); c != nil {
				return strings.ToLower(c[1])
			}
		}
		return "a command of the script on line " + m[2]
	}
	return "a command of script " + m[1]
}

var (
	noperm = regexp.MustCompile(`^NOPERM .*run the '([^']+)' command`)
	// Redis 7.2 and later name the command inside a script.
	inScript72 = regexp.MustCompile(`ACL failure in script: .*run the '([^']+)' command`)
	inScript   = regexp.MustCompile(`can't run this command or subcommand script: ([0-9a-f]{40}), on @user_script:(\d+)`)
	luaCall    = regexp.MustCompile(`redis\.p?call\('([A-Za-z|]+)'`)
)
