package guard

import (
	"hash/maphash"
	"strconv"
	"sync/atomic"
	"testing"
)

// TestSeenTable: an ID saw is seen; one never saw is not; and an ID read
// again and again stays seen while many others go in (a way of its set is
// taken at random only when all four are used, and its next read puts it
// back).
func TestSeenTable(t *testing.T) {
	s := &seenTable{seed: maphash.MakeSeed()}
	// 100 IDs: that five of them land in one of the 8,192 sets (and one is
	// pushed out) has a chance of about 1e-11; with 1,000 it was about 0.2%.
	for i := range 100 {
		s.saw("a" + strconv.Itoa(i))
	}
	for i := range 100 {
		if !s.seen("a" + strconv.Itoa(i)) {
			t.Fatalf("a%d: saw, not seen", i)
		}
		if s.seen("b" + strconv.Itoa(i)) {
			t.Fatalf("b%d: seen, never saw", i)
		}
	}
	misses := 0
	for i := range 200_000 { // six times the table's ways
		s.saw("c" + strconv.Itoa(i))
		if i%10 == 0 { // the hot ID, read every tenth insert
			if !s.seen("hot") {
				misses++
			}
			s.saw("hot")
		}
	}
	if misses > 200 { // 20,000 reads; its set takes about 1 insert in 8,192
		t.Fatalf("the hot ID was not seen on %d of 20,000 reads", misses)
	}

	// Two IDs read often whose hashes meet in one set both stay seen.
	s = &seenTable{seed: maphash.MakeSeed()}
	s.saw("hot")
	setOf := func(id string) *[4]atomic.Uint64 { set, _ := s.set(id); return set }
	other := ""
	for i := 0; other == ""; i++ {
		if id := "x" + strconv.Itoa(i); setOf(id) == setOf("hot") {
			other = id
		}
	}
	s.saw(other)
	for range 1000 {
		for _, id := range []string{"hot", other} {
			if !s.seen(id) {
				t.Fatalf("%s, read every other time, was pushed out by %s", id, map[string]string{"hot": other, other: "hot"}[id])
			}
			s.saw(id)
		}
	}
}
