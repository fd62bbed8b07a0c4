package codec_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/codec"
)

type node struct {
	Name     string
	Children []*node
	Parent   *node
}

type base struct {
	ID    string
	Price int
}

func TestShapeSeesEveryChange(t *testing.T) {
	type inner struct{ A int }
	type innerRenamed struct{ B int }
	shapes := map[string]reflect.Type{
		"base": reflect.TypeFor[base](),
		"renamed": reflect.TypeFor[struct {
			ID         string
			PriceCents int
		}](),
		"added": reflect.TypeFor[struct {
			ID    string
			Price int
			Stock int
		}](),
		"removed": reflect.TypeFor[struct{ ID string }](),
		"retyped": reflect.TypeFor[struct {
			ID    string
			Price float64
		}](),
		"tag changed": reflect.TypeFor[struct {
			ID    string
			Price int `msgpack:"p"`
		}](),
		"reordered": reflect.TypeFor[struct {
			Price int
			ID    string
		}](),
		"nested":          reflect.TypeFor[struct{ In inner }](),
		"nested renamed":  reflect.TypeFor[struct{ In innerRenamed }](),
		"slice of nested": reflect.TypeFor[struct{ In []inner }](),
		"map of nested":   reflect.TypeFor[struct{ In map[string]inner }](),
		"pointer":         reflect.TypeFor[struct{ In *inner }](),
		"time":            reflect.TypeFor[struct{ At time.Time }](),
		"duration":        reflect.TypeFor[struct{ At time.Duration }](),
		"recursive":       reflect.TypeFor[node](),
		"embedded":        reflect.TypeFor[struct{ base }](),
	}
	seen := map[string]string{}
	for name, typ := range shapes {
		s := codec.Shape(codec.Msgpack, typ)
		if len(s) != 16 {
			t.Fatalf("%s: shape %q, want 16 hex digits", name, s)
		}
		if other, ok := seen[s]; ok {
			t.Errorf("%s and %s share shape %s", name, other, s)
		}
		seen[s] = name
	}
}

func TestShapeIgnoresWhatTheCodecIgnores(t *testing.T) {
	type unexported struct {
		ID    string
		Price int
		cache []byte //nolint:unused // unexported: never encoded
	}
	type otherTags struct {
		ID    string `db:"id" validate:"required"`
		Price int    `json:"price"`
	}
	want := codec.Shape(codec.Msgpack, reflect.TypeFor[base]())
	for name, typ := range map[string]reflect.Type{
		"unexported field": reflect.TypeFor[unexported](),
		"other tags":       reflect.TypeFor[otherTags](),
	} {
		if got := codec.Shape(codec.Msgpack, typ); got != want {
			t.Errorf("%s: shape %s, want %s (msgpack reads neither)", name, got, want)
		}
	}
	// JSON reads its own tag, and a codec that does not say reads them all.
	if codec.Shape(codec.JSON, reflect.TypeFor[otherTags]()) == codec.Shape(codec.JSON, reflect.TypeFor[base]()) {
		t.Error("JSON: a json tag did not change the shape")
	}
	if codec.Shape(plainCodec{}, reflect.TypeFor[otherTags]()) == codec.Shape(plainCodec{}, reflect.TypeFor[base]()) {
		t.Error("a codec without Shape: a tag did not change the shape")
	}
	if got := codec.Shape(selfDescribing{}, reflect.TypeFor[base]()); got != "" {
		t.Errorf("a self-describing codec's shape: %q, want its own answer \"\"", got)
	}
}

type plainCodec struct{}

func (plainCodec) ID() byte                    { return 9 }
func (plainCodec) Marshal(any) ([]byte, error) { return nil, nil }
func (plainCodec) Unmarshal([]byte, any) error { return nil }

type selfDescribing struct{ plainCodec }

func (selfDescribing) Shape(reflect.Type) string { return "" }
