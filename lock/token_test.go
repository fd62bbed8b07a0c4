package lock

import (
	"encoding/hex"
	"sync"
	"testing"
)

// TestTokensAreUnique: tokens drawn at once from many goroutines never
// repeat, share this process's prefix, and are 128 bits in hex.
func TestTokensAreUnique(t *testing.T) {
	const goroutines, each = 8, 2000
	var mu sync.Mutex // guards seen
	seen := make(map[string]bool, goroutines*each)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				tok, err := newToken()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				dup := seen[tok]
				seen[tok] = true
				mu.Unlock()
				if dup {
					t.Errorf("token %s handed out twice", tok)
				}
			}
		}()
	}
	wg.Wait()
	prefix := hex.EncodeToString(tokens.prefix[:])
	for tok := range seen {
		if b, err := hex.DecodeString(tok); err != nil || len(b) != 16 || tok[:16] != prefix {
			t.Fatalf("token %q: want 128 bits in hex starting with the process prefix %s", tok, prefix)
		}
	}
	if len(seen) != goroutines*each {
		t.Fatalf("%d distinct tokens, want %d", len(seen), goroutines*each)
	}
}
