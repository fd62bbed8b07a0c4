// Package doccheck holds the user docs (README.md and docs/*.md) to the
// code: their Go blocks are copies of compiled files, and the names, metric
// names, flags and log messages they quote exist. The whole-docs tests are
// in this package's tests; the modules that serve metrics or own commands
// check theirs with the helpers here (issue 62).
package doccheck

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// MetricOwners: which test checks the metric names of each prefix against
// what its source serves (the longest prefix wins). A documented name with
// no owner fails in this package's tests.
var MetricOwners = map[string]string{
	"cacheguard_":          "guardprometheus (TestDocsMetrics: the collector over a Guard)",
	"cacheguard_pgfollow_": "follow/postgres/cmd/cacheguard-pgfollow (TestCommand: its -metrics)",
	"otel_cacheguard_":     "examples/shop (TestDocsMetrics: /metrics)",
	"shop_":                "examples/shop (TestDocsMetrics: /metrics)",
}

// Owner is the owner of a metric name, "" if none.
func Owner(name string) string {
	best := ""
	for p := range MetricOwners {
		if strings.HasPrefix(name, p) && len(p) > len(best) {
			best = p
		}
	}
	return best
}

// Mention is a metric name the docs name, and where.
type Mention struct {
	Name string
	At   string
}

// Metrics is every metric-like token of the docs (prose, spans and blocks),
// in order; tokens that are file names (shop_test.go) are left out.
func Metrics(docs []*Doc) []Mention {
	var out []Mention
	for _, d := range docs {
		for i, l := range d.Lines {
			for _, m := range metricRE.FindAllStringIndex(l, -1) {
				if rest := l[m[1]:]; strings.HasPrefix(rest, ".go") || strings.HasPrefix(rest, ".md") {
					continue
				}
				out = append(out, Mention{Name: l[m[0]:m[1]], At: At(d.Path, i+1)})
			}
		}
	}
	return out
}

var exposition = regexp.MustCompile(`(?m)^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)`)

// Served parses a Prometheus text exposition into the names it serves, as
// its TYPE lines give them (a histogram's name without _bucket, _sum and
// _count; a counter's with its _total).
func Served(body string) map[string]bool {
	names := map[string]bool{}
	for _, m := range exposition.FindAllStringSubmatch(body, -1) {
		name := m[1]
		if m[2] == "counter" && !strings.HasSuffix(name, "_total") && strings.Contains(body, "\n"+name+"_total") {
			name += "_total"
		}
		names[name] = true
	}
	return names
}

// normal is a documented name as TYPE lines give it.
func normal(name string, served map[string]bool) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, s); ok && served[b] {
			return b
		}
	}
	return name
}

// CheckMetrics compares what a source serves with the docs both ways: each
// documented name owned by one of prefixes must be served, and each served
// name with one of those prefixes (and no longer prefix owned elsewhere)
// must be named in the docs. source names the source in messages.
func CheckMetrics(docs []*Doc, served map[string]bool, source string, prefixes ...string) (problems []string, checked int) {
	mine := func(name string) bool {
		o := Owner(name)
		for _, p := range prefixes {
			if o == p {
				return true
			}
		}
		return false
	}
	documented := map[string]bool{}
	for _, m := range Metrics(docs) {
		if !mine(m.Name) {
			continue
		}
		checked++
		n := normal(m.Name, served)
		documented[n] = true
		if !served[n] {
			problems = append(problems, fmt.Sprintf("%s: metric %s: %s does not serve it (it serves %s)",
				m.At, m.Name, source, strings.Join(near(n, served), ", ")))
		}
	}
	var names []string
	for n := range served {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if mine(n) && !documented[n] {
			problems = append(problems, fmt.Sprintf("%s serves %s, which neither README.md nor docs/ names", source, n))
		}
	}
	return problems, checked
}

// TestMetrics is a module's whole-docs metric test: CheckMetrics of the
// docs under the repository's root, each problem an error of t.
func TestMetrics(t testing.TB, served map[string]bool, source string, prefixes ...string) {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	problems, n := CheckMetrics(docs, served, source, prefixes...)
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("%d metric names of the docs (%s) checked against the %d that %s serves", n, strings.Join(prefixes, ", "), len(served), source)
}

// near is the served names that share the documented name's first two
// words, or all of them.
func near(name string, served map[string]bool) []string {
	var all, close []string
	w := strings.SplitN(name, "_", 3)
	for s := range served {
		all = append(all, s)
		if len(w) > 1 && strings.HasPrefix(s, w[0]+"_"+w[1]) {
			close = append(close, s)
		}
	}
	if len(close) == 0 {
		close = all
	}
	sort.Strings(close)
	return close
}

// Flags and make targets -----------------------------------------------------

var usageFlag = regexp.MustCompile(`(?m)^ {2}-([a-zA-Z0-9][\w-]*)(?:\s|$)`)
