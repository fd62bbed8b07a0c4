package keyspace

import (
	"strconv"
	"strings"
	"sync"
)

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash
// tag (the part between the first '{' and the next '}', if not empty), or
// of the whole key.
func Slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % Slots
}

// slotTags[s] is a short hash tag of slot s, found once (about 160,000
// CRCs: every slot is reached by the numbers below 200,000).
var slotTags = sync.OnceValue(func() *[Slots]string {
	var tags [Slots]string
	for n, left := 0, Slots; left > 0; n++ {
		t := strconv.Itoa(n)
		if s := Slot(t); tags[s] == "" {
			tags[s], left = t, left-1
		}
	}
	return &tags
})

// Mark is the counter a Guard's writes of slot's keys advance (token: the
// Guard's own, so that no other process advances it). In a cluster it
// lives in slot, next to the keys it counts; elsewhere slot is ignored.
func (s Guard) Mark(token string, slot uint16, cluster bool) string {
	if !cluster {
		return s.base + "mark:" + token
	}
	return s.base + "mark:" + token + ":{" + slotTags()[slot] + "}"
}
