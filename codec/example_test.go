package codec_test

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/cacheguard/cacheguard/codec"
)

func Example() {
	type Product struct {
		ID   int
		Name string
	}
	frame, err := codec.Encode(codec.Msgpack, Product{ID: 42, Name: "lamp"})
	if err != nil {
		panic(err)
	}
	var p Product
	err = codec.Decode(codec.Msgpack, frame, &p)
	fmt.Println(p, err)

	// An empty-value marker is one byte and never decodes as a value.
	err = codec.Decode(codec.Msgpack, codec.Empty(), &p)
	fmt.Println(errors.Is(err, codec.ErrEmpty))

	// Five hostile bytes are rejected before the decoder can allocate 64 GiB.
	err = codec.Decode(codec.Msgpack, []byte{codec.KindValue, 1, 0xdd, 0xff, 0xff, 0xff, 0xff}, &p)
	fmt.Println(errors.Is(err, codec.ErrCorrupt))
	// Output:
	// {42 lamp} <nil>
	// true
	// true
}

// Two releases of a type: the renamed field gives the second another shape,
// so a Guard keeps their entries apart instead of decoding a zero.
func ExampleShape() {
	type V1 struct {
		ID    string
		Price int
	}
	type V2 struct {
		ID         string
		PriceCents int
	}
	type Renamed struct { // the Go type's name is not part of the shape
		ID    string
		Price int
	}
	v1 := codec.Shape(codec.Msgpack, reflect.TypeFor[V1]())
	fmt.Println(len(v1), v1 == codec.Shape(codec.Msgpack, reflect.TypeFor[V2]()))
	fmt.Println(v1 == codec.Shape(codec.Msgpack, reflect.TypeFor[Renamed]()))
	// Output:
	// 16 false
	// true
}
