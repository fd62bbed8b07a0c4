package chaos

import (
	"os"
	"strings"
	"testing"
)

// TestGuaranteesQuoteTheRuns: docs/guarantees.md quotes the last line of
// each report it names (the runs of make chaos it stands on), as it is.
func TestGuaranteesQuoteTheRuns(t *testing.T) {
	doc, err := os.ReadFile("../docs/guarantees.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, report := range []string{"../docs/chaos.md", "../docs/chaos-cluster.md"} {
		b, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		last := lines[len(lines)-1]
		if !strings.HasPrefix(last, "chaos: seed ") || !strings.Contains(string(doc), last) {
			t.Errorf("docs/guarantees.md does not quote %s's last line %q", report, last)
		}
		if !strings.HasSuffix(last, " 0 violations, 0 false not-found, 0 503s with Redis up") {
			t.Errorf("%s: %q: the run the docs stand on failed", report, last)
		}
	}
}
