// Package codec turns values into the bytes cacheguard stores in Redis and
// back, inside a small frame whose first byte is its kind: a value frame is
// [KindValue][codec id][payload], an empty-value marker ("the source of truth
// says this ID does not exist") is the single byte [KindEmpty], and a value to
// refresh ahead of its expiry is [KindValueRefresh][8 bytes: refresh-at, unix
// milliseconds, big-endian][codec id][payload]. A marker is never taken for a
// value, nor a value written by one codec decoded by another.
//
// Cached bytes are untrusted input (anyone with access to Redis can write
// them): Decode never panics, and the msgpack codec checks every length
// prefix against the bytes that remain before the decoder sees them.
package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Frame kinds, the first byte of every stored entry.
const (
	KindValue        byte = 0x01
	KindEmpty        byte = 0x02
	KindValueRefresh byte = 0x03
)

var (
	// ErrCorrupt reports bytes that are not a well-formed frame of this codec.
	ErrCorrupt = errors.New("codec: corrupt frame")
	// ErrEmpty is returned by Decode for an empty-value marker.
	ErrEmpty = errors.New("codec: empty-value marker")
)

// Codec marshals values. ID is stored in every frame; 0 is reserved.
// Unmarshal must neither modify data nor keep it: the Gets of one key that
// share a read decode the same bytes.
type Codec interface {
	ID() byte
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// Msgpack is the default codec (github.com/vmihailenco/msgpack/v5), with
// length prefixes validated before decoding.
var Msgpack Codec = msgpackCodec{}

// JSON is encoding/json: larger and slower, but readable with redis-cli.
var JSON Codec = jsonCodec{}

// Empty returns the empty-value marker frame.
func Empty() []byte { return []byte{KindEmpty} }

// Encode marshals v with c and frames it.
func Encode(c Codec, v any) ([]byte, error) { return encode(c, v, []byte{KindValue, c.ID()}) }

// EncodeRefresh marshals v with c and frames it with a refresh-at time:
// readers serve it, and refresh it once that time has passed.
func EncodeRefresh(c Codec, v any, at time.Time) ([]byte, error) {
	header := binary.BigEndian.AppendUint64([]byte{KindValueRefresh}, uint64(at.UnixMilli()))
	return encode(c, v, append(header, c.ID()))
}

// encode is header followed by v marshalled with c.
func encode(c Codec, v any, header []byte) ([]byte, error) {
	payload, err := c.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("codec: marshal %T: %w", v, err)
	}
	return append(append(make([]byte, 0, len(header)+len(payload)), header...), payload...), nil
}

// RefreshAt returns the refresh-at time of a frame made by EncodeRefresh;
// ok is false for any other frame.
func RefreshAt(data []byte) (at time.Time, ok bool) {
	if len(data) < 10 || data[0] != KindValueRefresh {
		return time.Time{}, false
	}
	return time.UnixMilli(int64(binary.BigEndian.Uint64(data[1:9]))), true
}

// Decode unframes data and unmarshals it into v (a non-nil pointer). It
// returns ErrEmpty for an empty-value marker and an error wrapping ErrCorrupt
// for anything that is not a well-formed frame of codec c.
func Decode(c Codec, data []byte, v any) (err error) {
	var id byte
	var payload []byte
	switch {
	case len(data) == 1 && data[0] == KindEmpty:
		return ErrEmpty
	case len(data) >= 2 && data[0] == KindValue:
		id, payload = data[1], data[2:]
	case len(data) >= 10 && data[0] == KindValueRefresh:
		id, payload = data[9], data[10:]
	default:
		return fmt.Errorf("%w: bad header", ErrCorrupt)
	}
	if id != c.ID() {
		return fmt.Errorf("%w: written by codec %d, reading with codec %d", ErrCorrupt, id, c.ID())
	}
	defer func() { // a codec must never take the process down on bad bytes
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: decoder panicked: %v", ErrCorrupt, p)
		}
	}()
	if err := c.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return nil
}

type msgpackCodec struct{}

func (msgpackCodec) ID() byte                      { return 1 }
func (msgpackCodec) Marshal(v any) ([]byte, error) { return msgpack.Marshal(v) }
func (msgpackCodec) Unmarshal(data []byte, v any) error {
	if err := CheckMsgpack(data); err != nil {
		return err
	}
	d := decoders.Get().(*decoder)
	d.r.Reset(data)
	d.dec.Reset(&d.r) // every state, as msgpack.Unmarshal's pooled decoders
	err := d.dec.Decode(v)
	d.r.Reset(nil) // the pool keeps no caller's bytes
	decoders.Put(d)
	return err
}

// decoder is msgpack.Unmarshal's decoder with the bytes.Reader it reads
// from, pooled together: Unmarshal makes a new reader for every call.
type decoder struct {
	r   bytes.Reader
	dec *msgpack.Decoder
}

var decoders = sync.Pool{New: func() any {
	d := &decoder{}
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}}

type jsonCodec struct{}

func (jsonCodec) ID() byte                           { return 2 }
func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// MaxDepth is how deeply arrays and maps may nest in a msgpack payload.
const MaxDepth = 256

var errTruncated = errors.New("msgpack: truncated")

// CheckMsgpack reports whether data is exactly one well-formed msgpack object
// whose every length prefix fits in the bytes that follow it, nested at most
// MaxDepth deep: msgpack/v5 trusts length prefixes, and five bytes could make
// it allocate 64 GiB (docs/design.md, Small mechanisms). It allocates nothing for depth
// <= 32.
func CheckMsgpack(data []byte) error {
	var stackBuf [32]uint64
	stack := stackBuf[:0] // objects still to read at each open level
	need := uint64(1)     // objects still to read at the current level
	p := 0
	for {
		for need == 0 {
			if len(stack) == 0 {
				if p != len(data) {
					return fmt.Errorf("msgpack: %d trailing bytes", len(data)-p)
				}
				return nil
			}
			need, stack = stack[len(stack)-1], stack[:len(stack)-1]
		}
		need--
		if p >= len(data) {
			return errTruncated
		}
		c := data[p]
		p++
		var skip, items uint64 // payload bytes to skip; child objects to read
		switch {
		case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c <= 0x8f:
			items = 2 * uint64(c&0x0f)
		case c <= 0x9f:
			items = uint64(c & 0x0f)
		case c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc1:
			return errors.New("msgpack: reserved byte 0xc1")
		default:
			var err error
			switch c {
			case 0xc4, 0xc5, 0xc6: // bin 8, 16, 32
				skip, p, err = readLen(data, p, 1<<(c-0xc4))
			case 0xd9, 0xda, 0xdb: // str 8, 16, 32
				skip, p, err = readLen(data, p, 1<<(c-0xd9))
			case 0xc7, 0xc8, 0xc9: // ext 8, 16, 32: length, type byte, data
				skip, p, err = readLen(data, p, 1<<(c-0xc7))
				skip++
			case 0xca, 0xce, 0xd2: // 4-byte numbers
				skip = 4
			case 0xcb, 0xcf, 0xd3: // 8-byte numbers
				skip = 8
			case 0xcc, 0xd0:
				skip = 1
			case 0xcd, 0xd1:
				skip = 2
			case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16 plus type byte
				skip = 1 + 1<<(c-0xd4)
			case 0xdc, 0xdd: // array 16, 32
				items, p, err = readLen(data, p, 2<<(c-0xdc))
			case 0xde, 0xdf: // map 16, 32: a key and a value per entry
				items, p, err = readLen(data, p, 2<<(c-0xde))
				items *= 2
			}
			if err != nil {
				return err
			}
		}
		rest := uint64(len(data) - p)
		if skip > rest {
			return fmt.Errorf("msgpack: length %d exceeds the %d bytes left", skip, rest)
		}
		p += int(skip)
		if items > 0 {
			if items > rest {
				return fmt.Errorf("msgpack: %d elements cannot fit in the %d bytes left", items, rest)
			}
			if len(stack) >= MaxDepth {
				return fmt.Errorf("msgpack: nested deeper than %d", MaxDepth)
			}
			stack = append(stack, need)
			need = items
		}
	}
}

// readLen reads a big-endian length of size bytes at p.
func readLen(data []byte, p int, size byte) (uint64, int, error) {
	if len(data)-p < int(size) {
		return 0, p, errTruncated
	}
	switch size {
	case 1:
		return uint64(data[p]), p + 1, nil
	case 2:
		return uint64(binary.BigEndian.Uint16(data[p:])), p + 2, nil
	default:
		return uint64(binary.BigEndian.Uint32(data[p:])), p + 4, nil
	}
}
