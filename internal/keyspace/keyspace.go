// Package keyspace names every Redis key and channel of a Guard; all start
// with its KeyPrefix, so "~<prefix>:* &<prefix>:*" covers them in an ACL.
// For KeyPrefix p and name n:
//
//	p:n:{enc(id)}            hash: value frame or empty marker per version,
//	                         and Filled: when Redis's clock wrote them
//	p:n:{enc(id)}:lock       the load lock; :waiting, a flight waits for it
//	p:n:bf:meta              the filter's layout and generation
//	p:n:bf:{p:n:bf:G:S}      bitmap shard S of generation G (:up: staging)
//	p:n:loaded, :invalidated channels: loads finished, invalidations
//
// The keys of one ID share its hash tag (one cluster slot). enc is injective
// and brace-free ('%', '{', '}' are escaped), so no ID can name another's
// key or slot; empty, control-byte and over-long IDs are refused.
package keyspace

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrInvalidKey is wrapped by Value's error for a malformed ID (re-exported as
// guard.ErrInvalidKey).
var ErrInvalidKey = errors.New("cacheguard: invalid key")

// Filled is the value hash's field that holds when its entry was written,
// in microseconds of Redis's own clock (the inspector of package pgfollow
// reads it). No schema version can name it: versions hold no space.
const Filled = " filled"

// Guard names the keys and channels of one Guard.
type Guard struct {
	base   string // "<prefix>:<name>:"
	maxLen int
}

// MaxKeyLen is the longest ID a Guard accepts, in bytes (the HTTP adapters
// and the admin command check IDs with it too): long enough for any key
// column, short enough that Redis keys stay small.
const MaxKeyLen = 4096

// ForGuard returns the names of the Guard called name under prefix, whose IDs
// are at most maxLen bytes. Both must have been checked with ValidPrefix and
// ValidName.
func ForGuard(prefix, name string, maxLen int) Guard {
	return Guard{base: prefix + ":" + name + ":", maxLen: maxLen}
}

// Value returns the value key of id, or an error wrapping ErrInvalidKey.
func (s Guard) Value(id string) (string, error) {
	if err := s.Check(id); err != nil {
		return "", err
	}
	return s.base + "{" + escaper.Replace(id) + "}", nil
}

// escaper is enc: it escapes the bytes that would end or nest a hash tag,
// and '%' itself, so that enc is injective; unescaper inverts it.
var (
	escaper   = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
	unescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")
)

// ID is the inverse of Value: the ID whose value key vkey is, or false if
// vkey is not a value key of this Guard (another Guard's, a lock or fence
// key, or malformed).
func (s Guard) ID(vkey string) (string, bool) {
	enc, ok := strings.CutPrefix(vkey, s.base+"{")
	if !ok {
		return "", false
	}
	if enc, ok = strings.CutSuffix(enc, "}"); !ok || enc == "" || strings.ContainsAny(enc, "{}") {
		return "", false
	}
	id := unescaper.Replace(enc)
	return id, escaper.Replace(id) == enc // a stray '%' does not encode back
}

// Check reports whether id is usable (an error wrapping ErrInvalidKey if not)
// without building its key.
func (s Guard) Check(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(id) > s.maxLen {
		return fmt.Errorf("%w: too long (%d bytes, at most %d)", ErrInvalidKey, len(id), s.maxLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: control byte 0x%02x at %d", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// MaxKeyLen is the longest ID accepted, in bytes.
func (s Guard) MaxKeyLen() int { return s.maxLen }

// IDKeys is a SCAN MATCH pattern of the keys of the Guard's IDs (values,
// locks and waiting marks; another Guard's may match: check each with
// Owner).
func (s Guard) IDKeys() string { return s.base + "{*" }

// Owner is the value key of the ID that key (a value key, a lock or a
// waiting mark) belongs to, or false if it is no such key of this Guard.
func (s Guard) Owner(key string) (vkey string, ok bool) {
	vkey, _ = strings.CutSuffix(key, ":lock")
	vkey, _ = strings.CutSuffix(vkey, ":waiting")
	_, ok = s.ID(vkey)
	return vkey, ok
}

// Loaded is the channel on which a load's end is published (payload: the
// value key).
func (s Guard) Loaded() string { return s.base + "loaded" }

// Invalidated is the channel on which invalidations are published (payload:
// the value key).
func (s Guard) Invalidated() string { return s.base + "invalidated" }

// Filter returns the names of the Guard's bloom filter.
func (s Guard) Filter() Filter { return Filter{base: s.base + "bf"} }

// Lock is the load lock of a value key (same hash tag).
func Lock(vkey string) string { return vkey + ":lock" }

// Waiting is the mark that a flight waits for the load of a value key
// (same hash tag): the holder PUBLISHes the key when it is done only if the
// mark is there, and deletes it.
func Waiting(vkey string) string { return vkey + ":waiting" }

// Filter names the keys of one bloom filter.
type Filter struct {
	base string // "<prefix>:<name>:bf", or any brace-free key given to bloom.Open
}

// ForFilter returns the names of the filter whose keys start with base (which
// must be brace-free).
func ForFilter(base string) Filter { return Filter{base: base} }

// Base is the key given to bloom.Open: every key of the filter starts with
// "<Base>:".
func (f Filter) Base() string { return f.base }

// Meta is the hash that holds the filter's layout and generation.
func (f Filter) Meta() string { return f.base + ":meta" }

// Shard is bitmap i of generation gen, with a hash tag of its own.
func (f Filter) Shard(gen int64, i int) string {
	g, n := strconv.FormatInt(gen, 10), strconv.Itoa(i)
	return f.base + ":{" + f.base + ":" + g + ":" + n + "}"
}

// Staging is where a rebuild uploads a shard's bits before merging them (the
// shard's hash tag).
func Staging(shard string) string { return shard + ":up" }

// RebuildLock is the lock that lets one rebuild run at a time.
func (f Filter) RebuildLock() string { return f.base + ":{" + f.base + "}:rebuild" }

// AutoRebuilt marks, for a while, that an automatic rebuild started (in any
// process), so that the next one waits.
func (f Filter) AutoRebuilt() string { return f.base + ":{" + f.base + "}:auto" }

// ValidName reports whether s is usable as a Guard name: 1 to 64 bytes of
// letters, digits, '_', '-' and '.'.
func ValidName(s string) bool {
	return s != "" && len(s) <= 64 && !strings.ContainsFunc(s, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.')
	})
}

// ValidPrefix reports whether s is usable as a KeyPrefix: 1 to 64 printable
// ASCII bytes without braces, spaces or glob characters (*?[]\, which would
// make the ACL pattern "<prefix>:*" match more than the prefix). Colons are
// allowed ("app:cache").
func ValidPrefix(s string) bool {
	return s != "" && len(s) <= 64 && !strings.ContainsFunc(s, func(c rune) bool {
		return c <= ' ' || c >= 0x7f || strings.ContainsRune("{}*?[]\\", c)
	})
}

// Position is the key holding the position of the change feed called feed
// (a follower's), beside the Guard's keys and outside their patterns.
func (s Guard) Position(feed string) string { return s.base + "pos:" + feed }

// PositionIn is Position in slot, for a Redis Cluster, where each master
// holds one (in the first slot of its first range).
func (s Guard) PositionIn(feed string, slot uint16) string {
	return s.base + "pos:" + feed + ":{" + slotTags()[slot] + "}"
}
