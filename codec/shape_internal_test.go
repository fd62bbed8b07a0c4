package codec

import (
	"reflect"
	"strings"
	"testing"
)

// jsonOnly encodes itself for JSON only: msgpack encodes its fields.
type jsonOnly struct{ Price int }

func (jsonOnly) MarshalJSON() ([]byte, error) { return []byte("0"), nil }

// TestShapeOfASelfEncoderHasItsFields: a type with its own encoding is named
// in the shape and its fields are described too, so that renaming one of
// them changes the shape for a codec that does not call that encoding.
func TestShapeOfASelfEncoderHasItsFields(t *testing.T) {
	var b strings.Builder
	describe(&b, reflect.TypeFor[struct{ In jsonOnly }](), "msgpack", map[reflect.Type]bool{})
	if d := b.String(); !strings.Contains(d, "jsonOnly") || !strings.Contains(d, "Price") {
		t.Fatalf("shape description %q: want the type's name and its field", d)
	}
}
