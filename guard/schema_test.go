package guard_test

import (
	"context"
	"errors"
	"iter"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// The value type of one release, and of the next releases: each changes
// V1's shape in one way that msgpack would decode leniently into a zero.
type (
	priceV1 struct {
		ID    string
		Price int
	}
	priceRenamed struct {
		ID         string
		PriceCents int
	}
	priceAdded struct {
		ID    string
		Price int
		Stock int
	}
	priceRemoved struct {
		ID string
	}
	priceRetagged struct {
		ID    string
		Price int `msgpack:"price"`
	}
)

// release is one build of a service: its Guard, bound to its own type, and
// the loads it made.
type release[T any] struct {
	g     *guard.Guard
	loads atomic.Int64
	row   T    // what the source of truth holds, in this release's type
	many  bool // it reads with GetMany
}

func openRelease[T any](t *testing.T, c *redistest.Conn, row T) *release[T] {
	t.Helper()
	g, err := guard.New(context.Background(), c, "product", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{
		IDs: func(context.Context) iter.Seq2[string, error] { return guard.IDs([]string{"42"}) },
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return &release[T]{g: g, row: row}
}

func (r *release[T]) get(t *testing.T, id string) (T, error) {
	t.Helper()
	if r.many {
		m, err := guard.GetMany(context.Background(), r.g, []string{id}, func(context.Context, []string) (map[string]T, error) {
			r.loads.Add(1)
			return map[string]T{id: r.row}, nil
		})
		return m[id], err
	}
	return guard.Get(context.Background(), r.g, id, func(context.Context, string) (T, error) {
		r.loads.Add(1)
		return r.row, nil
	})
}

// zeroed reports whether v has a zero field, which the source never has.
func zeroed(v any) bool {
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		if rv.Field(i).IsZero() {
			return true
		}
	}
	return false
}

// readAcross caches id in a and then reads it in b, and back: neither
// decodes the other's bytes, each loads once and keeps its own entry.
func readAcross[A, B any](t *testing.T, c *redistest.Conn, id string, a *release[A], b *release[B]) (zeros int) {
	t.Helper()
	for round := range 2 { // the second round: both entries are cached
		va, err := a.get(t, id)
		if err != nil {
			t.Fatal(err)
		}
		vb, err := b.get(t, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []any{va, vb} {
			if zeroed(v) {
				zeros++
				t.Errorf("round %d: %T answered %+v: a zero the source does not hold", round, v, v)
			}
		}
	}
	if a.loads.Load() != 1 || b.loads.Load() != 1 {
		t.Errorf("loads %d and %d, want 1 each (each shape keeps its own entry)", a.loads.Load(), b.loads.Load())
	}
	if sa, sb := a.g.Stats(), b.g.Stats(); sb.SchemaMisses != 1 || sa.CorruptValues+sb.CorruptValues != 0 {
		t.Errorf("stats %+v and %+v: want 1 schema miss in the later release, nothing corrupt", sa, sb)
	}
	if n := c.HLen(context.Background(), c.Prefix+":product:{"+id+"}").Val(); n != 3 {
		t.Errorf("the hash holds %d fields, want 3 (one per shape, and the fill time)", n)
	}
	return zeros
}

// TestChangedTypeIsAMiss: a release whose value type has another shape
// (a field renamed, added, removed, retagged) reads the earlier release's
// entry as a miss, never as a value with zeros, and keeps its own entry
// beside it while both releases run.
func TestChangedTypeIsAMiss(t *testing.T) {
	t.Parallel() // its own keys, no process-wide state: runs beside the others
	v1 := priceV1{ID: "42", Price: 4200}
	zeros := 0
	t.Run("renamed", func(t *testing.T) {
		c := redistest.Connect(t)
		zeros += readAcross(t, c, "42", openRelease(t, c, v1), openRelease(t, c, priceRenamed{ID: "42", PriceCents: 4200}))
	})
	t.Run("added", func(t *testing.T) {
		c := redistest.Connect(t)
		zeros += readAcross(t, c, "42", openRelease(t, c, v1), openRelease(t, c, priceAdded{ID: "42", Price: 4200, Stock: 7}))
	})
	t.Run("removed", func(t *testing.T) { // the earlier release reads the later one's entry
		c := redistest.Connect(t)
		zeros += readAcross(t, c, "42", openRelease(t, c, priceRemoved{ID: "42"}), openRelease(t, c, v1))
	})
	t.Run("retagged", func(t *testing.T) {
		c := redistest.Connect(t)
		zeros += readAcross(t, c, "42", openRelease(t, c, v1), openRelease(t, c, priceRetagged{ID: "42", Price: 4200}))
	})
	t.Run("renamed, read by GetMany", func(t *testing.T) {
		c := redistest.Connect(t)
		a, b := openRelease(t, c, v1), openRelease(t, c, priceRenamed{ID: "42", PriceCents: 4200})
		a.many, b.many = true, true
		zeros += readAcross(t, c, "42", a, b)
	})
	t.Logf("zero-valued answers across a rename, an added, a removed field and a changed tag: %d", zeros)
}

// TestWritesReachEveryShape: a write by one release is seen by the other:
// Set and Invalidate drop every shape's entry, Delete marks every shape
// that had one.
func TestWritesReachEveryShape(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c := redistest.Connect(t)
	old := openRelease(t, c, priceV1{ID: "42", Price: 4200})
	next := openRelease(t, c, priceRenamed{ID: "42", PriceCents: 4200})
	both := func() {
		t.Helper()
		if _, err := old.get(t, "42"); err != nil {
			t.Fatal(err)
		}
		if _, err := next.get(t, "42"); err != nil {
			t.Fatal(err)
		}
	}
	both()
	old.row.Price = 5000 // UPDATE, then the later release writes through
	if err := guard.Set(ctx, next.g, "42", priceRenamed{ID: "42", PriceCents: 5000}); err != nil {
		t.Fatal(err)
	}
	if v, err := old.get(t, "42"); err != nil || v.Price != 5000 {
		t.Fatalf("the earlier release after the later one's Set: %+v, %v; want the new price", v, err)
	}
	next.row.PriceCents = 5000
	both()
	if err := next.g.Delete(ctx, "42"); err != nil {
		t.Fatal(err)
	}
	loads := old.loads.Load()
	if _, err := old.get(t, "42"); !errors.Is(err, guard.ErrNotFound) || old.loads.Load() != loads {
		t.Fatalf("the earlier release after the later one's Delete: %v with %d loads, want ErrNotFound from the marker",
			err, old.loads.Load()-loads)
	}
}

// TestEarlierFormatIsReadOnceAsAMiss: an entry of the format before schema
// fields (the field named by Version alone) is neither served nor counted
// corrupt: the Guard loads once and serves its own entry from then on.
func TestEarlierFormatIsReadOnceAsAMiss(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	frame, err := codec.Encode(codec.Msgpack, priceV1{ID: "42", Price: 1}) // a stale price under the old field
	if err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, c.Prefix+":product:{42}", "1", frame).Err(); err != nil {
		t.Fatal(err)
	}
	r := openRelease(t, c, priceV1{ID: "42", Price: 4200})
	for range 3 {
		if v, err := r.get(t, "42"); err != nil || v.Price != 4200 {
			t.Fatalf("got %+v, %v; want the loaded row", v, err)
		}
	}
	if st := r.g.Stats(); r.loads.Load() != 1 || st.SchemaMisses != 1 || st.CorruptValues != 0 || st.Hits != 2 {
		t.Fatalf("%d loads, stats %+v; want 1 load, 1 schema miss, 2 hits, nothing corrupt", r.loads.Load(), st)
	}
}
