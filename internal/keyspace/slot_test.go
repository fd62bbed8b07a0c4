package keyspace

import "testing"

// TestSlot: the slots Redis's CLUSTER KEYSLOT gives (its documentation's
// examples and keys with hash tags), and a tag for every slot.
func TestSlot(t *testing.T) {
	for key, want := range map[string]uint16{
		"123456789":            12739, // the CRC16/XMODEM check value 0x31C3, mod 16384
		"foo":                  12182,
		"{user1000}.following": 3443,
		"{user1000}.followers": 3443,
		"foo{}{bar}":           8363, // an empty first tag: the whole key
		"{}":                   15257,
		"somekey":              11058,
		"foo{hash_tag}":        2515,
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	g := ForGuard("cg", "p", 128)
	for s := range uint16(Slots) {
		if got := Slot(g.Mark("t", s, true)); got != s {
			t.Fatalf("Mark of slot %d lands in slot %d", s, got)
		}
	}
}
