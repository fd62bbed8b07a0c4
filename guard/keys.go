package guard

import (
	"fmt"
	"strings"
)

// keyspace builds the Redis keys of one Guard.
//
// The value key of an ID is "<prefix>:<name>:{<enc(id)>}". enc is injective
// and brace-free: '%', '{' and '}' become "%25", "%7B" and "%7D", every other
// byte stays as it is. So the hash tag of a value key is exactly the encoded
// ID (no caller can pick another ID's slot or smuggle in a tag), the first '}'
// closes it (so "42}:lock" cannot become ID 42's lock key), and distinct IDs
// always get distinct keys. Keys that belong to the same ID (lock, fence) add
// a suffix after the brace and share the slot. IDs that are empty, longer
// than MaxKeyLen bytes or hold control bytes (< 0x20, 0x7f) are refused
// before any Redis command.
type keyspace struct {
	prefix string // "<KeyPrefix>:<name>:"
	maxLen int
}

// value returns the value key of id, or an error wrapping ErrInvalidKey.
func (ks keyspace) value(id string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(id) > ks.maxLen {
		return "", fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(id), ks.maxLen)
	}
	escapes := 0
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case c < 0x20 || c == 0x7f:
			return "", fmt.Errorf("%w: control byte 0x%02x at %d", ErrInvalidKey, c, i)
		case c == '%' || c == '{' || c == '}':
			escapes++
		}
	}
	var b strings.Builder
	b.Grow(len(ks.prefix) + len(id) + 2*escapes + 2)
	b.WriteString(ks.prefix)
	b.WriteByte('{')
	if escapes == 0 {
		b.WriteString(id)
	} else {
		for i := 0; i < len(id); i++ {
			switch c := id[i]; c {
			case '%':
				b.WriteString("%25")
			case '{':
				b.WriteString("%7B")
			case '}':
				b.WriteString("%7D")
			default:
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('}')
	return b.String(), nil
}

// validName reports whether s is usable as a Guard name: 1 to 64 bytes of
// letters, digits, '_', '-' and '.'.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// validPrefix reports whether s is usable as a KeyPrefix: 1 to 64 printable
// ASCII bytes without braces or spaces. Colons are allowed ("app:cache").
func validPrefix(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '{' || c == '}' {
			return false
		}
	}
	return true
}
