package codec_test

import (
	"bytes"
	"errors"
	"github.com/vmihailenco/msgpack/v5"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/codec"
)

type product struct {
	ID    int64
	Name  string
	Tags  []string
	Price float64
	At    time.Time
	Attrs map[string]int
}

func sample() product {
	return product{ID: 42, Name: "lamp", Tags: []string{"a", "b"}, Price: 9.5,
		At: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), Attrs: map[string]int{"w": 3}}
}

func TestRoundTrip(t *testing.T) {
	for _, c := range []codec.Codec{codec.Msgpack, codec.JSON} {
		frame, err := codec.Encode(c, sample())
		if err != nil {
			t.Fatal(err)
		}
		if frame[0] != codec.KindValue || frame[1] != c.ID() {
			t.Fatalf("codec %d: header % x", c.ID(), frame[:2])
		}
		var got product
		if err := codec.Decode(c, frame, &got); err != nil {
			t.Fatalf("codec %d: %v", c.ID(), err)
		}
		want := sample()
		if got.ID != want.ID || got.Name != want.Name || len(got.Tags) != 2 || got.Tags[1] != "b" ||
			got.Price != want.Price || !got.At.Equal(want.At) || got.Attrs["w"] != 3 {
			t.Fatalf("codec %d: got %+v, want %+v", c.ID(), got, want)
		}
	}
}

func TestEmptyMarkerIsNeverAValue(t *testing.T) {
	var s string
	if err := codec.Decode(codec.Msgpack, codec.Empty(), &s); !errors.Is(err, codec.ErrEmpty) {
		t.Fatalf("marker decoded as %v, want ErrEmpty", err)
	}
	// Values whose payload is a single byte still carry two header bytes.
	for _, v := range []any{nil, 0, "", false} {
		frame, err := codec.Encode(codec.Msgpack, v)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(frame, codec.Empty()) {
			t.Fatalf("value %v encodes to the marker", v)
		}
		var out any
		if err := codec.Decode(codec.Msgpack, frame, &out); err != nil {
			t.Fatalf("value %v: %v", v, err)
		}
	}
}

func TestCorruptFrames(t *testing.T) {
	jsonFrame, _ := codec.Encode(codec.JSON, "x")
	cases := map[string][]byte{
		"nil":            nil,
		"unknown kind":   {0x7f, 1, 0xc0},
		"header only":    {codec.KindValue},
		"other codec":    jsonFrame,
		"marker+junk":    {codec.KindEmpty, 0},
		"array32 bomb":   {codec.KindValue, 1, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"map32 bomb":     {codec.KindValue, 1, 0xdf, 0xff, 0xff, 0xff, 0xff},
		"str32 bomb":     {codec.KindValue, 1, 0xdb, 0xff, 0xff, 0xff, 0xff},
		"trailing bytes": {codec.KindValue, 1, 0x01, 0x02},
		"reserved c1":    {codec.KindValue, 1, 0xc1},
	}
	for name, frame := range cases {
		var v any
		if err := codec.Decode(codec.Msgpack, frame, &v); !errors.Is(err, codec.ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestCheckMsgpackDepth(t *testing.T) {
	deep := bytes.Repeat([]byte{0x91}, codec.MaxDepth+1)
	deep = append(deep, 0x00)
	if err := codec.CheckMsgpack(deep); err == nil {
		t.Fatal("nesting deeper than MaxDepth accepted")
	}
	ok := append(bytes.Repeat([]byte{0x91}, codec.MaxDepth), 0x00)
	if err := codec.CheckMsgpack(ok); err != nil {
		t.Fatalf("nesting of MaxDepth rejected: %v", err)
	}
}

// TestCheckMsgpackAcceptsEncoderOutput: the check must never reject what the
// encoder writes, or every cached value would be treated as corrupt.
func TestCheckMsgpackAcceptsEncoderOutput(t *testing.T) {
	big := make([]string, 70000)
	for i := range big {
		big[i] = "x"
	}
	for _, v := range []any{sample(), big, map[string]any{"a": []any{1, "b", 2.5, nil, true}}, []byte("raw"), int64(-1 << 40), uint64(1 << 63)} {
		frame, err := codec.Encode(codec.Msgpack, v)
		if err != nil {
			t.Fatal(err)
		}
		if err := codec.CheckMsgpack(frame[2:]); err != nil {
			t.Fatalf("%T: %v", v, err)
		}
	}
}

// FuzzDecode feeds arbitrary bytes to Decode for several target types. It
// must not panic, and what it allocates must stay within a small multiple of
// the input size. The seeds (run by every `go test`) include the five bytes
// dd ff ff ff ff that make unchecked msgpack/v5 die of out-of-memory.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xdc, 0xff, 0xff})
	f.Add([]byte{0xc6, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xc9, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add(bytes.Repeat([]byte{0x91}, 300))
	good, _ := codec.Encode(codec.Msgpack, sample())
	f.Add(good[2:])
	f.Fuzz(func(t *testing.T, payload []byte) {
		frame := append([]byte{codec.KindValue, codec.Msgpack.ID()}, payload...)
		limit := uint64(1<<20 + 512*len(payload))
		targets := []func() error{
			func() error { var v any; return codec.Decode(codec.Msgpack, frame, &v) },
			func() error { var v product; return codec.Decode(codec.Msgpack, frame, &v) },
			func() error { var v []string; return codec.Decode(codec.Msgpack, frame, &v) },
			func() error { var v map[string]any; return codec.Decode(codec.Msgpack, frame, &v) },
			func() error {
				var v any
				return codec.Decode(codec.JSON, append([]byte{codec.KindValue, codec.JSON.ID()}, payload...), &v)
			},
		}
		for i, decode := range targets {
			var err error
			if n := allocated(func() { err = decode() }); n > limit {
				t.Fatalf("target %d allocated %d bytes for %d input bytes (limit %d)", i, n, len(payload), limit)
			}
			if err != nil && !errors.Is(err, codec.ErrCorrupt) {
				t.Fatalf("target %d: error %v does not wrap ErrCorrupt", i, err)
			}
		}
	})
}

func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func BenchmarkDecodeMsgpack(b *testing.B) {
	frame, _ := codec.Encode(codec.Msgpack, sample())
	b.ReportAllocs()
	for b.Loop() {
		var p product
		if err := codec.Decode(codec.Msgpack, frame, &p); err != nil {
			b.Fatal(err)
		}
	}
}

func TestRefreshFrame(t *testing.T) {
	at := time.UnixMilli(1_800_000_000_123)
	frame, err := codec.EncodeRefresh(codec.Msgpack, "hello", at)
	if err != nil {
		t.Fatal(err)
	}
	before := slices.Clone(frame)
	var s string
	if err := codec.Decode(codec.Msgpack, frame, &s); err != nil || s != "hello" {
		t.Fatalf("decode: %q, %v", s, err)
	}
	if !slices.Equal(frame, before) {
		t.Fatal("Decode changed the frame it read")
	}
	if got, ok := codec.RefreshAt(frame); !ok || !got.Equal(at) {
		t.Fatalf("RefreshAt = %v, %v", got, ok)
	}
	plain, _ := codec.Encode(codec.Msgpack, "hello")
	if _, ok := codec.RefreshAt(plain); ok {
		t.Fatal("a plain value frame has no refresh-at time")
	}
	if err := codec.Decode(codec.JSON, frame, &s); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("another codec's refresh frame: %v", err)
	}
	if err := codec.Decode(codec.Msgpack, frame[:9], &s); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("a truncated refresh frame: %v", err)
	}
}

// BenchmarkDecodeMsgpackBare is msgpack.Unmarshal alone, what Decode costs
// without its frame header, the CheckMsgpack walk and the recover: the
// price of those checks is the difference with BenchmarkDecodeMsgpack.
func BenchmarkDecodeMsgpackBare(b *testing.B) {
	raw, _ := msgpack.Marshal(sample())
	b.ReportAllocs()
	for b.Loop() {
		var p product
		if err := msgpack.Unmarshal(raw, &p); err != nil {
			b.Fatal(err)
		}
	}
}
