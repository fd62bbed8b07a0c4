package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
)

// TestQuickstart runs the demo against its own redis-server and checks the
// figures it prints: the table must come from what happened.
func TestQuickstart(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	rows := map[string]string{ // row label → DB calls and round trips
		`Get 42 \(cold`:          `1\s+\d+`,
		`Get 42 again \(hit\)`:   `0\s+1`,
		`Get 999999`:             `0\s+1`,
		`Get 1000 again`:         `0\s+1`,
		`100 goroutines Get 7.*`: `100 got product 7\s+1\s+\d+`,
	}
	for label, want := range rows {
		if !regexp.MustCompile(label + `.*\s` + want + `\n`).Match(out.Bytes()) {
			t.Errorf("row %q does not show %q", label, want)
		}
	}
}
