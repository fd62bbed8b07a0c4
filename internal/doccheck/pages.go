// Package doccheck holds the user docs (README.md and docs/*.md) to the
// code: their Go blocks are copies of compiled files, and the names, metric
// names, flags and log messages they quote exist. The whole-docs tests are
// in this package's tests; the modules that serve metrics or own commands
// check theirs with the helpers here (issue 62).
package doccheck

import (
	"regexp"
	"strings"
)

// UserDocs are the pages written for users: they name no tests (which
// test holds what is docs/guarantees.md's job).
var UserDocs = []string{"README.md", "docs/usage.md", "docs/operations.md", "docs/follow.md", "docs/behaviour.md", "docs/demo.md"}

var testMention = regexp.MustCompile(`\b(Test|Benchmark|Fuzz)[A-Z_][A-Za-z0-9_]*`)

// CheckNoTests reports the test, benchmark and fuzz names in the user docs.
func CheckNoTests(docs []*Doc) (problems []string) {
	for _, d := range docs {
		if !slicesHas(UserDocs, d.Path) {
			continue
		}
		for i, l := range d.Lines {
			for _, m := range testMention.FindAllString(l, -1) {
				problems = append(problems, At(d.Path, i+1)+": "+m+": a user page names no test (docs/guarantees.md does)")
			}
		}
	}
	return problems
}

var number = regexp.MustCompile(`\d[\d,]*(\.\d+)?`)

// CheckQuotedNumbers reports the numbers of README's Results table that
// docs/benchmarks.md, the one source of the figures, does not hold
// (thousands separators aside). Numbers of fewer than three digits are
// too common to check.
func CheckQuotedNumbers(readme, benchmarks *Doc) (problems []string, checked int) {
	have := map[string]bool{}
	for _, l := range benchmarks.Lines {
		for _, n := range number.FindAllString(l, -1) {
			have[strings.ReplaceAll(n, ",", "")] = true
		}
	}
	in := false
	for i, l := range readme.Lines {
		if strings.HasPrefix(l, "## ") {
			in = l == "## Results"
		}
		if !in || !strings.HasPrefix(l, "|") {
			continue
		}
		for _, n := range number.FindAllString(l, -1) {
			n = strings.ReplaceAll(n, ",", "")
			if len(strings.ReplaceAll(n, ".", "")) < 3 {
				continue
			}
			checked++
			if !have[n] {
				problems = append(problems, At(readme.Path, i+1)+": "+n+": not in "+benchmarks.Path)
			}
		}
	}
	return problems, checked
}
