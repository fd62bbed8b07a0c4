package codec

import (
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// Shaper is an optional interface of a Codec. Shape returns a short name
// of what the codec writes for type t: two types whose frames may not
// decode into each other get different names, so their entries are kept
// apart. A self-describing codec, whose frames never decode into the wrong
// field, returns "" to share entries across shapes.
type Shaper interface {
	Shape(t reflect.Type) string
}

// Shape names t's shape for c: c's own Shape if it has one, or else a
// fingerprint of t's field names, types and the codec's struct tags (every
// tag, for a codec that does not say which it reads). It is derived once
// per codec and type.
func Shape(c Codec, t reflect.Type) string {
	if s, ok := c.(Shaper); ok {
		return s.Shape(t)
	}
	return Fingerprint(t, "")
}

func (msgpackCodec) Shape(t reflect.Type) string { return Fingerprint(t, "msgpack") }
func (jsonCodec) Shape(t reflect.Type) string    { return Fingerprint(t, "json") }

type shapeKey struct {
	t   reflect.Type
	tag string
}

var fingerprints sync.Map // shapeKey → string: each type is walked once

// Fingerprint is 16 hex digits of a hash of t's shape: field names and
// types, walked through pointers, slices, arrays, maps and nested structs,
// and each field's struct tag tag ("": the whole tag); a named type that
// encodes itself (time.Time) counts by its name too. Renaming the Go type
// does not change it; renaming, adding, retyping or retagging a field does.
func Fingerprint(t reflect.Type, tag string) string {
	k := shapeKey{t, tag}
	if fp, ok := fingerprints.Load(k); ok {
		return fp.(string)
	}
	var b strings.Builder
	describe(&b, t, tag, map[reflect.Type]bool{})
	sum := sha256.Sum256([]byte(b.String()))
	fp := hex.EncodeToString(sum[:8])
	fingerprints.Store(k, fp)
	return fp
}

var selfEncoding = []reflect.Type{
	reflect.TypeFor[msgpack.CustomEncoder](), reflect.TypeFor[msgpack.Marshaler](),
	reflect.TypeFor[json.Marshaler](), reflect.TypeFor[encoding.BinaryMarshaler](),
	reflect.TypeFor[encoding.TextMarshaler](),
}

// describe writes t's shape to b; open holds the structs being described,
// so that a recursive type ends.
func describe(b *strings.Builder, t reflect.Type, tag string, open map[reflect.Type]bool) {
	if t.Name() != "" && t.Kind() != reflect.Interface {
		for _, m := range selfEncoding {
			if t.Implements(m) || reflect.PointerTo(t).Implements(m) {
				// Its own encoding, named, and its fields as well: a codec
				// may not use that method (msgpack ignores MarshalJSON).
				b.WriteString(t.PkgPath() + "." + t.Name() + " ")
				break
			}
		}
	}
	switch t.Kind() {
	case reflect.Pointer:
		b.WriteByte('*')
		describe(b, t.Elem(), tag, open)
	case reflect.Slice:
		b.WriteString("[]")
		describe(b, t.Elem(), tag, open)
	case reflect.Array:
		b.WriteString("[" + strconv.Itoa(t.Len()) + "]")
		describe(b, t.Elem(), tag, open)
	case reflect.Map:
		b.WriteString("map[")
		describe(b, t.Key(), tag, open)
		b.WriteByte(']')
		describe(b, t.Elem(), tag, open)
	case reflect.Struct:
		if open[t] {
			b.WriteString("^" + t.PkgPath() + "." + t.Name())
			return
		}
		open[t] = true
		b.WriteByte('{')
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() && !f.Anonymous {
				continue
			}
			b.WriteString(f.Name)
			if tag == "" {
				b.WriteString(strconv.Quote(string(f.Tag)))
			} else {
				b.WriteString(strconv.Quote(f.Tag.Get(tag)))
			}
			if f.Anonymous {
				b.WriteString(" embedded")
			}
			b.WriteByte(' ')
			describe(b, f.Type, tag, open)
			b.WriteByte(';')
		}
		b.WriteByte('}')
		delete(open, t)
	default:
		b.WriteString(t.Kind().String())
	}
}
