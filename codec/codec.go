// Package codec turns values into the bytes cacheguard stores in Redis and
// back, inside a small frame.
//
// Every stored entry starts with a one-byte kind: a value frame is
// [KindValue][codec id][payload], an empty-value marker ("the source of truth
// says this ID does not exist") is the single byte [KindEmpty], and a value
// that should be refreshed ahead of its expiry is [KindValueRefresh][8 bytes:
// refresh-at, unix milliseconds, big-endian][codec id][payload]. A marker can
// therefore never be mistaken for a value, a value written by one codec is
// never decoded by another, and a later format can take a new kind byte.
//
// Cached bytes are untrusted input (anyone with access to Redis can write
// them). Decode never panics, and the msgpack codec checks every length
// prefix against the bytes that remain before the decoder sees them, so five
// bytes cannot make it allocate gigabytes.
package codec

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
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

var emptyFrame = string([]byte{KindEmpty})

// Empty returns the empty-value marker frame.
func Empty() []byte { return []byte(emptyFrame) }

// Encode marshals v with c and frames it.
func Encode(c Codec, v any) ([]byte, error) {
	payload, err := c.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("codec: marshal %T: %w", v, err)
	}
	frame := make([]byte, 2+len(payload))
	frame[0], frame[1] = KindValue, c.ID()
	copy(frame[2:], payload)
	return frame, nil
}

// EncodeRefresh marshals v with c and frames it with a refresh-at time:
// readers serve it, and refresh it once that time has passed.
func EncodeRefresh(c Codec, v any, at time.Time) ([]byte, error) {
	payload, err := c.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("codec: marshal %T: %w", v, err)
	}
	frame := make([]byte, 10+len(payload))
	frame[0] = KindValueRefresh
	binary.BigEndian.PutUint64(frame[1:9], uint64(at.UnixMilli()))
	frame[9] = c.ID()
	copy(frame[10:], payload)
	return frame, nil
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
	return msgpack.Unmarshal(data, v)
}

type jsonCodec struct{}

func (jsonCodec) ID() byte                           { return 2 }
func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
