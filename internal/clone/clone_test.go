package clone

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

type plain struct {
	ID    string
	Price int64
	At    time.Time
	Dims  [3]float64
	note  string // unexported, but a plain value
}

type product struct {
	ID      string
	Tags    []string
	Attrs   map[string][]int
	Parent  *product
	Kids    []product
	Sizes   [2][]int
	Created time.Time
	Nil     []string
	Empty   []string
	Ptr     *int
}

type tree struct {
	Name string
	Kids []*tree
}

type withAny struct{ V any }
type withChan struct{ C chan int }
type withFunc struct{ F func() }
type hidden struct{ tags []string }
type ptrKey struct{ M map[*int]int }

func TestShareable(t *testing.T) {
	check := func(name string, shareable, ok bool) {
		t.Helper()
		if !shareable || !ok {
			t.Errorf("%s: shareable %v, ok %v; want a plain assignment", name, shareable, ok)
		}
	}
	_, s, ok := For[int]()
	check("int", s, ok)
	_, s, ok = For[string]()
	check("string", s, ok)
	_, s, ok = For[time.Time]()
	check("time.Time", s, ok)
	_, s, ok = For[plain]()
	check("plain", s, ok)
	_, s, ok = For[[4]plain]()
	check("[4]plain", s, ok)
}

func TestRefused(t *testing.T) {
	refused := func(fn any, _, ok bool) bool { return !ok && reflect.ValueOf(fn).IsNil() }
	for name, r := range map[string]bool{
		"interface field":  refused(For[withAny]()),
		"chan field":       refused(For[withChan]()),
		"func field":       refused(For[withFunc]()),
		"unexported slice": refused(For[hidden]()),
		"pointer map key":  refused(For[ptrKey]()),
		"any":              refused(For[any]()),
		"[]any":            refused(For[[]any]()),
	} {
		if !r {
			t.Errorf("%s: For accepted it; want refused (decode instead)", name)
		}
	}
}

func sample() product {
	n := 7
	return product{
		ID:      "p1",
		Tags:    []string{"a", "b"},
		Attrs:   map[string][]int{"x": {1, 2}, "y": nil},
		Parent:  &product{ID: "p0", Tags: []string{"root"}},
		Kids:    []product{{ID: "k1", Tags: []string{"c"}}},
		Sizes:   [2][]int{{1}, {2, 3}},
		Created: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
		Empty:   []string{},
		Ptr:     &n,
	}
}

// TestCopyIsDeepAndEqual: the copy equals the source, nil and empty stay
// apart, and changing anything reachable in the copy leaves the source as
// it was.
func TestCopyIsDeepAndEqual(t *testing.T) {
	fn, shareable, ok := For[product]()
	if !ok || shareable || fn == nil {
		t.Fatalf("For[product]: shareable %v, ok %v", shareable, ok)
	}
	src := sample()
	cp := fn(src)
	if !reflect.DeepEqual(cp, src) {
		t.Fatalf("copy %+v\nsource %+v", cp, src)
	}
	if cp.Nil != nil || cp.Empty == nil {
		t.Fatalf("nil and empty slices: copy has %#v and %#v", cp.Nil, cp.Empty)
	}
	cp.Tags[0] = "changed"
	cp.Attrs["x"][0] = 99
	cp.Attrs["z"] = []int{1}
	cp.Parent.Tags[0] = "changed"
	cp.Parent.ID = "changed"
	cp.Kids[0].Tags[0] = "changed"
	cp.Sizes[1][0] = 99
	*cp.Ptr = 99
	if !reflect.DeepEqual(src, sample()) {
		t.Fatalf("changing the copy changed the source: %+v", src)
	}
}

func TestRecursiveType(t *testing.T) {
	fn, _, ok := For[tree]()
	if !ok || fn == nil {
		t.Fatalf("For[tree]: ok %v", ok)
	}
	src := tree{Name: "root", Kids: []*tree{{Name: "a", Kids: []*tree{{Name: "a1"}}}, nil, {Name: "b"}}}
	cp := fn(src)
	if !reflect.DeepEqual(cp, src) {
		t.Fatalf("copy %+v", cp)
	}
	cp.Kids[0].Kids[0].Name = "changed"
	if src.Kids[0].Kids[0].Name != "a1" {
		t.Fatal("changing the copy changed the source")
	}
}

// TestCopyMatchesDecode: for random values, a copy of the decoded value
// equals a second decode of the same bytes, which is what a local hit
// would otherwise hand out.
func TestCopyMatchesDecode(t *testing.T) {
	fn, _, _ := For[product]()
	r := rand.New(rand.NewPCG(1, 2))
	strs := func() []string {
		if r.IntN(4) == 0 {
			return nil
		}
		s := make([]string, r.IntN(4))
		for i := range s {
			s[i] = strconv.Itoa(r.IntN(1000))
		}
		return s
	}
	for i := range 500 {
		v := product{ID: strconv.Itoa(i), Tags: strs(), Empty: strs(), Kids: []product{{Tags: strs()}}}
		if r.IntN(2) == 0 {
			v.Attrs = map[string][]int{"k": {r.IntN(9)}}
			v.Parent = &product{ID: "p", Tags: strs()}
		}
		raw, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var a, b product
		if err := msgpack.Unmarshal(raw, &a); err != nil {
			t.Fatal(err)
		}
		if err := msgpack.Unmarshal(raw, &b); err != nil {
			t.Fatal(err)
		}
		if cp := fn(a); !reflect.DeepEqual(cp, b) {
			t.Fatalf("value %d: copy %+v\ndecode %+v", i, cp, b)
		}
	}
}

func BenchmarkCopyAgainstDecode(b *testing.B) {
	type value struct {
		ID, Name string
		Price    int64
		Tags     []string
	}
	v := value{ID: "p42", Name: "product p42", Price: 42, Tags: []string{"red", "large"}}
	raw, _ := msgpack.Marshal(v)
	fn, _, _ := For[value]()
	b.Run("copy", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = fn(v)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var out value
			if err := msgpack.Unmarshal(raw, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}
