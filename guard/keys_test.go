package guard

import (
	"errors"
	"strings"
	"testing"
)

// unescape inverts the encoding inside the braces; its existence is the
// proof that the encoding is injective.
func unescape(s string) string {
	r := strings.NewReplacer("%7B", "{", "%7D", "}", "%25", "%")
	return r.Replace(s)
}

func FuzzKeyEncoding(f *testing.F) {
	for _, s := range []string{"42", "42:lock", "42}:lock", "x}", "{a}", "%7B", "%", "\x00", "", strings.Repeat("k", 10_000), "a\nb", "ü"} {
		f.Add(s, "42")
	}
	ks := keyspace{prefix: "cg:product:", maxLen: 128}
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, errA := ks.value(a)
		kb, errB := ks.value(b)
		for _, c := range []struct {
			id, key string
			err     error
		}{{a, ka, errA}, {b, kb, errB}} {
			if c.err != nil {
				if !errors.Is(c.err, ErrInvalidKey) {
					t.Fatalf("%q: error %v is not ErrInvalidKey", c.id, c.err)
				}
				continue
			}
			inner, ok := strings.CutPrefix(c.key, ks.prefix+"{")
			if !ok || !strings.HasSuffix(inner, "}") {
				t.Fatalf("%q: key %q does not frame the ID in one hash tag", c.id, c.key)
			}
			inner = inner[:len(inner)-1]
			if strings.ContainsAny(inner, "{}") {
				t.Fatalf("%q: braces inside the hash tag: %q", c.id, c.key)
			}
			if unescape(inner) != c.id {
				t.Fatalf("%q: key %q does not decode back", c.id, c.key)
			}
		}
		if errA == nil && errB == nil && a != b && ka == kb {
			t.Fatalf("%q and %q share key %q", a, b, ka)
		}
	})
}
