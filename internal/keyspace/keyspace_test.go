package keyspace

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
	ks := ForGuard("cg", "product", 128)
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, errA := ks.Value(a)
		kb, errB := ks.Value(b)
		for _, c := range []struct {
			id, key string
			err     error
		}{{a, ka, errA}, {b, kb, errB}} {
			if c.err != nil {
				if !errors.Is(c.err, ErrInvalidKey) {
					t.Fatalf("%q: error %v is not ErrInvalidKey", c.id, c.err)
				}
				if ks.Check(c.id) == nil {
					t.Fatalf("%q: Value refused what Check accepts", c.id)
				}
				continue
			}
			inner, ok := strings.CutPrefix(c.key, "cg:product:{")
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
			if id, ok := ks.ID(c.key); !ok || id != c.id {
				t.Fatalf("%q: ID(%q) = %q, %v", c.id, c.key, id, ok)
			}
		}
		if errA == nil && errB == nil && a != b && ka == kb {
			t.Fatalf("%q and %q share key %q", a, b, ka)
		}
	})
}

// TestIDRefusesWhatIsNotAValueKey: ID answers only for this Guard's value
// keys (FuzzKeyEncoding checks that it inverts Value).
func TestIDRefusesWhatIsNotAValueKey(t *testing.T) {
	ks := ForGuard("cg", "product", 128)
	v, _ := ks.Value("a{b}%c")
	for _, k := range []string{
		"cg:user:{42}", "cg:product:42", "cg:product:{42}:lock", Lock(v), "cg:product:{}",
		"cg:product:{4{2}", "cg:product:{%7}", "cg:product:{%41}", "cg:product:{4%}", ks.Loaded(), ks.Filter().Meta(),
	} {
		if id, ok := ks.ID(k); ok {
			t.Errorf("ID(%q) = %q, want no ID", k, id)
		}
	}
	if id, ok := ks.ID(v); !ok || id != "a{b}%c" {
		t.Errorf("ID(%q) = %q, %v", v, id, ok)
	}
}

// TestEveryNameStartsWithThePrefix: the ACL pattern "<prefix>:*" covers every
// key and channel, and keys that scripts touch together share a hash tag.
func TestEveryNameStartsWithThePrefix(t *testing.T) {
	ks := ForGuard("app:cache", "product", 128)
	v, err := ks.Value("42")
	if err != nil {
		t.Fatal(err)
	}
	f := ks.Filter()
	shard := f.Shard(3, 1)
	names := []string{v, Lock(v), Waiting(v), ks.Loaded(), ks.Invalidated(), f.Meta(), shard, Staging(shard), f.RebuildLock()}
	for _, n := range names {
		if !strings.HasPrefix(n, "app:cache:") {
			t.Errorf("%q does not start with the prefix", n)
		}
	}
	tag := func(k string) string { _, r, _ := strings.Cut(k, "{"); t, _, _ := strings.Cut(r, "}"); return t }
	if tag(Lock(v)) != tag(v) || tag(Waiting(v)) != tag(v) || tag(v) != "42" {
		t.Errorf("value, lock and waiting tags: %q %q %q", tag(v), tag(Lock(v)), tag(Waiting(v)))
	}
	if tag(Staging(shard)) != tag(shard) || tag(shard) == tag(f.Shard(3, 2)) || tag(shard) == tag(f.Shard(4, 1)) {
		t.Errorf("shard tags: %q %q %q", tag(shard), tag(f.Shard(3, 2)), tag(f.Shard(4, 1)))
	}
	if ForGuard("cg", "a", 128).Filter().Shard(1, 0) == ForGuard("cg", "b", 128).Filter().Shard(1, 0) {
		t.Error("two Guards share a shard key")
	}
}

func TestValidNameAndPrefix(t *testing.T) {
	for s, want := range map[string]bool{"product": true, "a.b-c_1": true, "": false, "a:b": false, "x{y}": false, strings.Repeat("n", 65): false} {
		if ValidName(s) != want {
			t.Errorf("ValidName(%q) = %v", s, !want)
		}
	}
	for s, want := range map[string]bool{"cg": true, "app:cache": true, "a{b": false, "a b": false, "a*": false, "a?": false, "a[b]": false, "": false} {
		if ValidPrefix(s) != want {
			t.Errorf("ValidPrefix(%q) = %v", s, !want)
		}
	}
}

// TestOwner: values, locks and waiting marks name their ID's value key;
// other keys of the Guard, and another Guard's, do not.
func TestOwner(t *testing.T) {
	ks := ForGuard("app", "product", 100)
	vkey, err := ks.Value("a{b}%")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{vkey, Lock(vkey), Waiting(vkey)} {
		if got, ok := ks.Owner(k); !ok || got != vkey {
			t.Fatalf("Owner(%q) = %q, %v; want %q", k, got, ok, vkey)
		}
	}
	other := ForGuard("app", "product2", 100)
	ovkey, _ := other.Value("a")
	for _, k := range []string{ks.Filter().Meta(), ks.Loaded(), ovkey, Lock(ovkey), vkey + ":other"} {
		if got, ok := ks.Owner(k); ok {
			t.Fatalf("Owner(%q) = %q, true; want false", k, got)
		}
	}
}

// TestCheckSaysWhy: ErrInvalidKey's message names the cause (a 1 MiB ID is
// "too long", with its length and the limit).
func TestCheckSaysWhy(t *testing.T) {
	ks := ForGuard("cg", "product", 1024)
	for id, want := range map[string]string{
		strings.Repeat("k", 1<<20): "too long (1048576 bytes, at most 1024)",
		"":                         "empty",
		"a\x01b":                   "control byte 0x01 at 1",
	} {
		if err := ks.Check(id); !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), want) {
			t.Errorf("Check of a %d-byte ID: %v, want ErrInvalidKey saying %q", len(id), err, want)
		}
	}
}
