// Package doccheck holds the user docs (README.md and docs/*.md) to the
// code: their Go blocks are copies of compiled files, and the names, metric
// names, flags and log messages they quote exist. The whole-docs tests are
// in this package's tests; the modules that serve metrics or own commands
// check theirs with the helpers here (issue 62).
package doccheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// Doc is one Markdown file: its fenced blocks and inline code spans.
type Doc struct {
	Path   string // relative to the repository's root, e.g. docs/usage.md
	Lines  []string
	Blocks []Block
	Spans  []Span
}

// Block is a fenced code block.
type Block struct {
	Path  string
	Line  int    // of the opening fence, 1-based
	Lang  string // the info string's first word: go, sh, ... ("" unlabelled)
	Lines []string
}

// Span is an inline code span, its text as Markdown renders it.
type Span struct {
	Path string
	Line int
	Text string
}

// At is "path:line", the prefix of every problem.
func At(path string, line int) string { return fmt.Sprintf("%s:%d", path, line) }

var fence = regexp.MustCompile("^([ \t]*)(```+|~~~+)[ \t]*([^ \t`]*)")

// Parse splits a Markdown text into its fenced blocks and code spans.
func Parse(path, text string) *Doc {
	d := &Doc{Path: path, Lines: strings.Split(text, "\n")}
	prose := make([]string, len(d.Lines)) // the lines outside blocks; blocks blanked
	for i := 0; i < len(d.Lines); i++ {
		m := fence.FindStringSubmatch(d.Lines[i])
		if m == nil {
			prose[i] = d.Lines[i]
			continue
		}
		b := Block{Path: path, Line: i + 1, Lang: strings.ToLower(m[3])}
		indent, mark := len(m[1]), m[2]
		for i++; i < len(d.Lines); i++ {
			l := d.Lines[i]
			if t := strings.TrimLeft(l, " \t"); strings.HasPrefix(t, mark) && strings.Trim(t, mark[:1]+" \t") == "" {
				break
			}
			for k := 0; k < indent && len(l) > 0 && (l[0] == ' ' || l[0] == '\t'); k++ {
				l = l[1:]
			}
			b.Lines = append(b.Lines, l)
		}
		d.Blocks = append(d.Blocks, b)
	}
	d.Spans = spans(path, prose)
	return d
}

// spans finds the code spans of the prose: a run of n backticks up to the
// next run of exactly n in the same paragraph (CommonMark's rule).
func spans(path string, lines []string) []Span {
	text := strings.Join(lines, "\n")
	var out []Span
	for i := 0; i < len(text); {
		if text[i] != '`' {
			i++
			continue
		}
		n := run(text, i)
		end := -1
		for j := i + n; j < len(text); {
			if strings.HasPrefix(text[j:], "\n\n") {
				break
			}
			if text[j] != '`' {
				j++
				continue
			}
			if m := run(text, j); m == n {
				end = j
				break
			} else {
				j += m
			}
		}
		if end < 0 {
			i += n
			continue
		}
		s := strings.ReplaceAll(text[i+n:end], "\n", " ")
		if len(s) > 2 && s[0] == ' ' && s[len(s)-1] == ' ' {
			s = s[1 : len(s)-1]
		}
		out = append(out, Span{Path: path, Line: strings.Count(text[:i], "\n") + 1, Text: s})
		i = end + n
	}
	return out
}

func run(s string, i int) int {
	n := 0
	for i+n < len(s) && s[i+n] == '`' {
		n++
	}
	return n
}

// Root is the repository's top directory.
func Root() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("doccheck: git rev-parse: %v", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Load reads README.md and docs/*.md under root.
func Load(root string) ([]*Doc, error) {
	paths, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	paths = append([]string{filepath.Join(root, "README.md")}, paths...)
	var docs []*Doc
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(root, p)
		docs = append(docs, Parse(filepath.ToSlash(rel), string(b)))
	}
	return docs, nil
}

// TrackedGo is every Go file git tracks under root (make test compiles
// each), by path relative to root.
func TrackedGo(root string) (map[string][]string, error) {
	out, err := exec.Command("git", "-C", root, "ls-files", "*.go").Output()
	if err != nil {
		return nil, fmt.Errorf("doccheck: git ls-files: %v", err)
	}
	files := map[string][]string{}
	for _, p := range strings.Fields(string(out)) {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return nil, err
		}
		files[p] = strings.Split(string(b), "\n")
	}
	return files, nil
}

// Metric names --------------------------------------------------------------

var metricRE = regexp.MustCompile(`\b(?:otel_cacheguard|cacheguard|shop)_[a-z0-9_]*[a-z0-9]\b`)

// MetricOwners: which test checks the metric names of each prefix against
// what its source serves (the longest prefix wins). A documented name with
// no owner fails in this package's tests.
var MetricOwners = map[string]string{
	"cacheguard_":          "guardprometheus (TestDocsMetrics: the collector over a Guard)",
	"cacheguard_pgfollow_": "follow/postgres/cmd/cacheguard-pgfollow (TestDocsMetrics: -metrics)",
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

// UsageFlags is the flags a Go command's -h output lists.
func UsageFlags(usage string) map[string]bool {
	flags := map[string]bool{}
	for _, m := range usageFlag.FindAllStringSubmatch(usage, -1) {
		flags[m[1]] = true
	}
	return flags
}

// GoTestFlags may be quoted bare (`-short`): they are go test's.
var GoTestFlags = strings.Fields("short race run bench benchmem benchtime count v timeout cpu fuzz fuzztime parallel cover tags")

// commandOf maps how a doc invokes a command to its name: the name,
// ./shop, bin/shop, or go run of its path (benchmarks/ is a command too).
var commandOf = map[string]string{
	"cacheguard": "cacheguard", "cacheguard-pgfollow": "cacheguard-pgfollow",
	"shop": "shop", "./shop": "shop", "bin/shop": "shop", "./bin/shop": "shop",
	"./cmd/cacheguard": "cacheguard", "github.com/cacheguard/cacheguard/cmd/cacheguard": "cacheguard",
	"./follow/postgres/cmd/cacheguard-pgfollow": "cacheguard-pgfollow", "./cmd/cacheguard-pgfollow": "cacheguard-pgfollow",
	"github.com/cacheguard/cacheguard/follow/postgres/cmd/cacheguard-pgfollow": "cacheguard-pgfollow",
	"./examples/shop": "shop",
	".":               "benchmarks", // the docs' go run . is always in benchmarks/
	"./benchmarks":    "benchmarks",
}

var (
	envAssign = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=\S*$`)
	quoted    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'[^']*'`)
	flagWord  = regexp.MustCompile(`^--?([a-zA-Z][\w-]*)(?:=.*)?$`)
	shellLang = map[string]bool{"": true, "sh": true, "shell": true, "console": true, "bash": true}
)

// invocation splits a shell line into the command it runs and its words,
// "" when it runs none of ours.
func invocation(line string) (cmd string, words []string) {
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i]
	}
	words = strings.Fields(quoted.ReplaceAllString(line, `""`))
	for len(words) > 0 && (words[0] == "$" || envAssign.MatchString(words[0])) {
		words = words[1:]
	}
	if len(words) >= 3 && words[0] == "go" && (words[1] == "run" || words[1] == "install") {
		words = words[2:]
		for len(words) > 0 && strings.HasPrefix(words[0], "-") { // go run's own flags
			words = words[1:]
		}
		if len(words) > 0 {
			words[0], _, _ = strings.Cut(words[0], "@")
		}
	}
	if len(words) == 0 {
		return "", nil
	}
	return commandOf[words[0]], words[1:]
}

// shellLines is each command line of the docs' shell blocks (continued
// lines joined) and of their code spans, with where it is.
func shellLines(docs []*Doc) (lines, at []string, fromSpan []bool) {
	for _, d := range docs {
		for _, b := range d.Blocks {
			if !shellLang[b.Lang] {
				continue
			}
			for i := 0; i < len(b.Lines); i++ {
				l, start := b.Lines[i], i
				for strings.HasSuffix(strings.TrimSpace(l), `\`) && i+1 < len(b.Lines) {
					i++
					l = strings.TrimSuffix(strings.TrimSpace(l), `\`) + " " + b.Lines[i]
				}
				lines, at, fromSpan = append(lines, l), append(at, At(b.Path, b.Line+1+start)), append(fromSpan, false)
			}
		}
		for _, s := range d.Spans {
			lines, at, fromSpan = append(lines, s.Text), append(at, At(s.Path, s.Line)), append(fromSpan, true)
		}
	}
	return lines, at, fromSpan
}

// CheckFlags: each flag given to one of our commands in the docs (shell
// blocks, code spans that start with the command) is one of its flags, and
// each code span that is a flag alone (`-exec`) is a flag of one of them
// or of go test. flags maps a command's name to its flags.
func CheckFlags(docs []*Doc, flags map[string]map[string]bool) (problems []string, checked int) {
	lines, at, fromSpan := shellLines(docs)
	for i, l := range lines {
		cmd, words := invocation(l)
		if cmd == "" && fromSpan[i] {
			if m := flagWord.FindStringSubmatch(strings.Fields(l + " x")[0]); m != nil && l[0] == '-' {
				checked++
				if !anyHas(flags, m[1]) && !slicesHas(GoTestFlags, m[1]) {
					problems = append(problems, fmt.Sprintf("%s: %s: no flag -%s in %s, nor in go test", at[i], l, m[1], strings.Join(keys(flags), ", ")))
				}
			}
			continue
		}
		if cmd == "" {
			continue
		}
		if flags[cmd] == nil {
			problems = append(problems, fmt.Sprintf("%s: %s: no flags known for %s", at[i], l, cmd))
			continue
		}
		for _, w := range words {
			m := flagWord.FindStringSubmatch(w)
			if m == nil {
				continue
			}
			checked++
			if !flags[cmd][m[1]] && m[1] != "h" && m[1] != "help" { // every Go command has -h
				problems = append(problems, fmt.Sprintf("%s: %s has no flag -%s (its flags: -%s)", at[i], cmd, m[1],
					strings.Join(keys(flags[cmd]), ", -")))
			}
		}
	}
	return problems, checked
}

func anyHas(flags map[string]map[string]bool, f string) bool {
	for _, fs := range flags {
		if fs[f] {
			return true
		}
	}
	return false
}

func slicesHas(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

var (
	makeTarget = regexp.MustCompile(`(?m)^([a-zA-Z][\w-]*):`)
	targetName = regexp.MustCompile(`^[a-zA-Z][\w-]*$`)
)

// CheckMake: each make target the docs run (a shell line or a code span
// starting with make) is a target of makefile.
func CheckMake(docs []*Doc, makefile string) (problems []string, checked int) {
	targets := map[string]bool{}
	for _, m := range makeTarget.FindAllStringSubmatch(makefile, -1) {
		targets[m[1]] = true
	}
	lines, at, _ := shellLines(docs)
	for i, l := range lines {
		words := strings.Fields(quoted.ReplaceAllString(l, `""`))
		for len(words) > 0 && (words[0] == "$" || envAssign.MatchString(words[0])) {
			words = words[1:]
		}
		if len(words) < 2 || words[0] != "make" {
			continue
		}
		for _, w := range words[1:] {
			if strings.HasPrefix(w, "#") {
				break
			}
			if !targetName.MatchString(w) {
				continue // a variable (DEMO_ARGS=...), a flag
			}
			checked++
			if !targets[w] {
				problems = append(problems, fmt.Sprintf("%s: make %s: no such target in the Makefile (it has %s)", at[i], w, strings.Join(keys(targets), ", ")))
			}
		}
	}
	return problems, checked
}

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
