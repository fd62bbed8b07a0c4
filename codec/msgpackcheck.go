package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MaxDepth is how deeply arrays and maps may nest in a msgpack payload.
const MaxDepth = 256

var errTruncated = errors.New("msgpack: truncated")

// CheckMsgpack reports whether data is exactly one well-formed msgpack object
// whose every length prefix fits in the bytes that follow it, nested at most
// MaxDepth deep.
//
// Why: msgpack/v5 (up to v5.4.1 at least) trusts length prefixes; the five
// bytes dd ff ff ff ff (array32 of 2^32-1 elements) make it allocate a 64 GiB
// slice and the runtime dies with a fatal out-of-memory that recover cannot
// catch. Every element of an array takes at least one byte and every map entry
// two, so an object that passes this check cannot make the decoder allocate
// more than a small multiple of len(data). The walk is iterative, allocation
// free for depth <= 32, and costs about a nanosecond a byte.
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
			var n uint64
			var err error
			switch c {
			case 0xc4, 0xd9: // bin8, str8
				n, p, err = readLen(data, p, 1)
				skip = n
			case 0xc5, 0xda: // bin16, str16
				n, p, err = readLen(data, p, 2)
				skip = n
			case 0xc6, 0xdb: // bin32, str32
				n, p, err = readLen(data, p, 4)
				skip = n
			case 0xc7: // ext8: len, type, data
				n, p, err = readLen(data, p, 1)
				skip = n + 1
			case 0xc8:
				n, p, err = readLen(data, p, 2)
				skip = n + 1
			case 0xc9:
				n, p, err = readLen(data, p, 4)
				skip = n + 1
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
			case 0xdc:
				n, p, err = readLen(data, p, 2)
				items = n
			case 0xdd:
				n, p, err = readLen(data, p, 4)
				items = n
			case 0xde:
				n, p, err = readLen(data, p, 2)
				items = 2 * n
			case 0xdf:
				n, p, err = readLen(data, p, 4)
				items = 2 * n
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

func readLen(data []byte, p, size int) (uint64, int, error) {
	if len(data)-p < size {
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
