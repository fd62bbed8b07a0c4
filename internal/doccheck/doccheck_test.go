package doccheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// repo is the repository as the tests read it, loaded once.
var repo = sync.OnceValues(func() (*source, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	s := &source{root: root}
	if s.docs, err = Load(root); err != nil {
		return nil, err
	}
	if s.files, err = TrackedGo(root); err != nil {
		return nil, err
	}
	s.idx, err = NewIndex(s.files)
	return s, err
})

type source struct {
	root  string
	docs  []*Doc
	files map[string][]string
	idx   *Index
}

func load(t *testing.T) *source {
	t.Helper()
	s, err := repo()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func report(t *testing.T, problems []string) {
	t.Helper()
	for _, p := range problems {
		t.Error(p)
	}
}

// TestDocsNameNoTests: the user pages speak of what the code does, not of
// the tests that hold it.
func TestDocsNameNoTests(t *testing.T) {
	report(t, CheckNoTests(load(t).docs))
}

// TestDriftNoTests: a test's name on a user page is caught; on
// docs/guarantees.md it is not.
func TestDriftNoTests(t *testing.T) {
	text := "Held by `TestStampedeAcrossProcesses`, measured by BenchmarkLag.\n"
	got := CheckNoTests([]*Doc{Parse("docs/usage.md", text), Parse("docs/guarantees.md", text)})
	want := []string{
		"docs/usage.md:1: TestStampedeAcrossProcesses: a user page names no test (docs/guarantees.md does)",
		"docs/usage.md:1: BenchmarkLag: a user page names no test (docs/guarantees.md does)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestDocsQuoteTheBenchmarks: README's results are docs/benchmarks.md's.
func TestDocsQuoteTheBenchmarks(t *testing.T) {
	docs := map[string]*Doc{}
	for _, d := range load(t).docs {
		docs[d.Path] = d
	}
	problems, n := CheckQuotedNumbers(docs["README.md"], docs["docs/benchmarks.md"])
	report(t, problems)
	if n < 10 {
		t.Errorf("%d numbers checked in README's Results: is the table still there?", n)
	}
	t.Logf("%d numbers of README's Results checked against docs/benchmarks.md", n)
}

// TestDriftQuotedNumbers: a figure README changed alone is caught.
func TestDriftQuotedNumbers(t *testing.T) {
	bench := Parse("docs/benchmarks.md", "| cacheguard | 161124 | 3.65× |\n")
	readme := Parse("README.md", "## Results\n\n| hits | 161,124 (3.65×) |\n| memory | 1,310,840 |\n\n## Read more\n| 999 |\n")
	problems, n := CheckQuotedNumbers(readme, bench)
	if want := "README.md:4: 1310840: not in docs/benchmarks.md"; n != 3 || len(problems) != 1 || problems[0] != want {
		t.Errorf("%d checked, problems %q; want 3 and %q", n, problems, want)
	}
}

// TestDocsGoBlocks: each go block of README.md and docs/ is a copy of a
// tracked Go file, which make test compiles (and runs, for examples).
func TestDocsGoBlocks(t *testing.T) {
	s := load(t)
	origins, problems := CheckBlocks(s.docs, s.files)
	report(t, problems)
	for _, o := range origins {
		if o.File != "" {
			t.Logf("%s: copy of %s:%d", At(o.Block.Path, o.Block.Line), o.File, o.Line)
		}
	}
	t.Logf("%d go blocks, %d of them copies", len(origins), len(origins)-len(problems))
}

// TestDocsNames: the Go names of the docs' code spans exist.
func TestDocsNames(t *testing.T) {
	s := load(t)
	problems, n := CheckNames(s.docs, s.idx)
	report(t, problems)
	t.Logf("%d names checked", n)
}

// TestDocsOTel: the OpenTelemetry names the docs quote are guard's, and
// each of guard's is quoted.
func TestDocsOTel(t *testing.T) {
	s := load(t)
	problems, n := CheckOTel(s.docs, s.files)
	report(t, problems)
	t.Logf("%d OpenTelemetry names checked", n)
}

// TestDocsMetricOwners: each metric name the docs give has a source whose
// test checks it (MetricOwners); those tests are in guardprometheus,
// examples/shop and follow/postgres/cmd/cacheguard-pgfollow.
func TestDocsMetricOwners(t *testing.T) {
	s := load(t)
	ms := Metrics(s.docs)
	for _, m := range ms {
		if Owner(m.Name) == "" {
			t.Errorf("%s: metric %s: no source serves names like it (doccheck.MetricOwners)", m.At, m.Name)
		}
	}
	t.Logf("%d metric names in the docs, checked against their sources in those modules' tests (doccheck.MetricOwners)", len(ms))
}

// TestDocsLogs: the messages the docs quote are logged (or returned as
// errors) by the code, and the runbook quotes each WARN and ERROR.
func TestDocsLogs(t *testing.T) {
	s := load(t)
	msgs, err := Messages(s.files)
	if err != nil {
		t.Fatal(err)
	}
	problems, n, warns := CheckLogs(s.docs, msgs, "docs/operations.md")
	report(t, problems)
	t.Logf("%d messages quoted in the docs checked against %d in the code (prefixes %q); %d WARN and ERROR messages:",
		n, len(msgs), LogPrefixes(msgs), len(warns))
	for _, w := range warns {
		t.Logf("  %s %s %q", w.At, strings.ToUpper(w.Level), w.Text)
	}
}

// TestDocsMake: the make targets the docs run exist.
func TestDocsMake(t *testing.T) {
	s := load(t)
	mk, err := os.ReadFile(filepath.Join(s.root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	problems, n := CheckMake(s.docs, string(mk))
	report(t, problems)
	t.Logf("%d make targets checked", n)
}

// commands builds cacheguard, cacheguard-pgfollow, the shop and the
// benchmarks (each in its module) and reads their flags from -h.
func commands(t *testing.T, root string) map[string]map[string]bool {
	dir := t.TempDir()
	flags := map[string]map[string]bool{}
	for _, c := range []struct{ name, module, pkg string }{
		{"cacheguard", ".", "./cmd/cacheguard"},
		{"cacheguard-pgfollow", "follow/postgres", "./cmd/cacheguard-pgfollow"},
		{"shop", "examples/shop", "."},
		{"benchmarks", "benchmarks", "."},
	} {
		bin := filepath.Join(dir, c.name)
		build := exec.Command("go", "build", "-C", filepath.Join(root, c.module), "-o", bin, c.pkg)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", c.name, err, out)
		}
		flags[c.name] = map[string]bool{}
		helps := [][]string{{"-h"}}
		if c.name == "shop" {
			helps = append(helps, []string{"attack", "-h"}) // shop demo and serve share the first
		}
		for _, args := range helps {
			out, _ := exec.Command(bin, args...).CombinedOutput() // -h exits 0 or 2
			got := UsageFlags(string(out))
			if len(got) == 0 {
				t.Fatalf("%s %s lists no flags:\n%s", c.name, strings.Join(args, " "), out)
			}
			for f := range got {
				flags[c.name][f] = true
			}
		}
	}
	return flags
}

// TestDocsFlags: the flags the docs give our commands are theirs, from
// each one's -h.
func TestDocsFlags(t *testing.T) {
	s := load(t)
	flags := commands(t, s.root)
	problems, n := CheckFlags(s.docs, flags)
	report(t, problems)
	for c, fs := range flags {
		t.Logf("%s: %d flags", c, len(fs))
	}
	t.Logf("%d flags in the docs checked", n)
}

// The drifts: each check reports a doc that drifted from the code.

const driftSource = `package drift

// Options is the drift test's options.
type Options struct {
	Filter    FilterOptions
	Telemetry TelemetryOptions
	Local     *LocalOptions
}

type FilterOptions struct{ IDs func() []string }

type TelemetryOptions struct{ TracerProvider any }

type LocalOptions struct{ Size int }

type Guard struct{}

func (g *Guard) Stats() Stats { return Stats{} }

type Stats struct{ CorruptValues int64 }

var ErrUnconfirmed error

func Example() {
	g := &Guard{}
	_ = g.Stats()
	println("unchanged line")
}
`

func driftIndex(t *testing.T) (map[string][]string, *Index) {
	files := map[string][]string{"drift/drift.go": strings.Split(driftSource, "\n")}
	idx, err := NewIndex(files)
	if err != nil {
		t.Fatal(err)
	}
	return files, idx
}

func TestDriftNames(t *testing.T) {
	_, idx := driftIndex(t)
	good := Parse("good.md", "`Options.Local`, `drift.ErrUnconfirmed`, `Stats().CorruptValues`, `Filter.IDs`,\n"+
		"`Options.Telemetry.TracerProvider`, `drift.Options{Local: nil}`, `ErrUnconfirmed`, `redis.Options.Addr`,\n"+
		"`github.com/cacheguard/cacheguard/guard`, `redis://h:6379/0`")
	if problems, n := CheckNames([]*Doc{good}, idx); len(problems) != 0 || n != 7 { // redis.Options.Addr is not ours: not counted
		t.Errorf("good names: %d checked, problems %q", n, problems)
	}
	for doc, want := range map[string]string{
		"`Options.TracerProvider`": "good.md:1: Options.TracerProvider: no field or method TracerProvider in drift.Options " +
			"(did you mean Options.Telemetry.TracerProvider?)",
		"`Stats().CorruptValue`":           "no field or method CorruptValue in drift.Stats",
		"`drift.ErrUnconfirmd`":            "package drift (drift) has no exported ErrUnconfirmd",
		"`drfit.Options`":                  "drfit is no package of ours",
		"`ErrUnconfirmd`":                  "ErrUnconfirmd: no exported name",
		"`drift.Options{Locl: nil}`":       "drift.Options{Locl: ...}: no field Locl in drift.Options",
		"x\n\n`Filter.ID`":                 "good.md:3: Filter.ID: no field or method ID in drift.FilterOptions",
		"`Guard.Stats.CorruptValues`":      "Guard.Stats is a func",
		"`Options.Local.Size.Bytes`":       "Options.Local.Size is a int",
		"`Options.Telemetry.MeterProvder`": "no field or method MeterProvder in drift.TelemetryOptions",
	} {
		problems, _ := CheckNames([]*Doc{Parse("good.md", doc)}, idx)
		if len(problems) != 1 || !strings.Contains(problems[0], want) {
			t.Errorf("%s: problems %q, want one with %q", doc, problems, want)
		}
	}
}

func TestDriftGoBlock(t *testing.T) {
	files, _ := driftIndex(t)
	block := "```go\ng := &Guard{}\n_ = g.Stats()\n%s\n```\n"
	if _, problems := CheckBlocks([]*Doc{Parse("d.md", fmt.Sprintf(block, `println("unchanged line")`))}, files); len(problems) != 0 {
		t.Errorf("a copy: %q", problems)
	}
	elided := "```go\ntype Guard struct{}\n...\n_ = g.Stats()\n```\n"
	if origins, problems := CheckBlocks([]*Doc{Parse("d.md", elided)}, files); len(problems) != 0 || origins[0].Line != 16 {
		t.Errorf("a copy with a line ...: %q, %+v", problems, origins)
	}
	_, problems := CheckBlocks([]*Doc{Parse("d.md", fmt.Sprintf(block, `println("changed line")`))}, files)
	want := `d.md:1: go block of 3 lines is no copy of a tracked Go file (closest: drift/drift.go, 2 of its lines; not there: "println(\"changed line\")")`
	if len(problems) != 1 || problems[0] != want {
		t.Errorf("a block one line off: %q, want %q", problems, want)
	}
}

func TestDriftMetrics(t *testing.T) {
	served := Served("# HELP cacheguard_gets_total Gets.\n# TYPE cacheguard_gets_total counter\ncacheguard_gets_total 1\n" +
		"# TYPE cacheguard_load_seconds histogram\ncacheguard_load_seconds_bucket{le=\"1\"} 1\n" +
		"# TYPE cacheguard_pgfollow_lag_bytes gauge\ncacheguard_pgfollow_lag_bytes 0\n")
	docs := []*Doc{Parse("m.md", "`cacheguard_gets_total{guard}` and `cacheguard_load_seconds_bucket`\n")}
	if problems, n := CheckMetrics(docs, served, "test", "cacheguard_"); len(problems) != 0 || n != 2 {
		t.Errorf("documented as served: %d checked, %q", n, problems)
	}
	docs = []*Doc{Parse("m.md", "`cacheguard_get_total` and `cacheguard_load_seconds`, not shop_test.go\n")}
	problems, _ := CheckMetrics(docs, served, "test", "cacheguard_")
	want := []string{
		"m.md:1: metric cacheguard_get_total: test does not serve it (it serves cacheguard_gets_total)",
		"test serves cacheguard_gets_total, which neither README.md nor docs/ names",
	}
	if fmt.Sprint(problems) != fmt.Sprint(want) {
		t.Errorf("a renamed metric: %q, want %q", problems, want)
	}
	if Owner("cacheguard_pgfollow_lag_bytes") != "cacheguard_pgfollow_" || Owner("shop_db_queries_total") != "shop_" || Owner("other") != "" {
		t.Error("Owner does not take the longest prefix")
	}
}

func TestDriftFlags(t *testing.T) {
	flags := map[string]map[string]bool{
		"cacheguard": UsageFlags("flags:\n  -name string\n    \tthe name\n  -exec string\n  -cluster\n"),
		"shop":       UsageFlags("Usage of shop:\n  -exit\n    \tdemo: exit\n"),
	}
	doc := Parse("f.md", "```sh\n$ REDIS_URL=redis://x cacheguard -name product -exec 'a -b' rebuild  # -not this\n"+
		"go run ./examples/shop demo \\\n  -exit\nshop -h\n```\n`-cluster`, `-race`, `shop demo -exit`, `go test -short ./...`\n")
	if problems, n := CheckFlags([]*Doc{doc}, flags); len(problems) != 0 || n != 7 {
		t.Errorf("the commands' own flags: %d checked, %q", n, problems)
	}
	doc = Parse("f.md", "```\ncacheguard -nme product info\n```\n`-clusters` or `shop demo -exits`\n")
	problems, _ := CheckFlags([]*Doc{doc}, flags)
	want := []string{
		"f.md:2: cacheguard has no flag -nme (its flags: -cluster, -exec, -name)",
		"f.md:4: -clusters: no flag -clusters in cacheguard, shop, nor in go test",
		"f.md:4: shop has no flag -exits (its flags: -exit)",
	}
	if fmt.Sprint(problems) != fmt.Sprint(want) {
		t.Errorf("wrong flags: %q, want %q", problems, want)
	}
	if problems, _ := CheckMake([]*Doc{Parse("f.md", "`make demo DEMO_ARGS=-exit`, `make chaso`\n")}, "demo: deps\n\tgo run .\n"); len(problems) != 1 ||
		!strings.HasPrefix(problems[0], "f.md:1: make chaso: no such target") {
		t.Errorf("a make target: %q", problems)
	}
}

func TestDriftLogs(t *testing.T) {
	src := `package drift

import "errors"

func f() {
	g.log.Warn("cacheguard: bloom filter saturated; rebuild it", "n", 1)
	log.Info("cacheguard: slot " + name + " dropped")
	return errors.New("cacheguard: no such guard")
}
`
	msgs, err := Messages(map[string][]string{"drift/drift.go": strings.Split(src, "\n")})
	if err != nil {
		t.Fatal(err)
	}
	good := Parse("docs/operations.md", "`cacheguard: bloom filter saturated; rebuild it` and `cacheguard: slot <name> dropped`,\n"+
		"`cacheguard: no such guard`\n```\ntime=x level=WARN msg=\"cacheguard: bloom filter saturated; rebuild it\" n=1\n```\n")
	if problems, n, warns := CheckLogs([]*Doc{good}, msgs, "docs/operations.md"); len(problems) != 0 || n != 4 || len(warns) != 1 {
		t.Errorf("quoted as logged: %d quotes, %d warns, %q", n, len(warns), problems)
	}
	for quote, want := range map[string]bool{"cacheguard: bloom filter saturated;": true, "cacheguard: slot ": true,
		"cacheguard: bloom filter saturated": true, "cacheguard: bloom filter": false, "cacheguard: sl": false,
		"cacheguard: ": false, "cacheguard: ...": false, "cacheguard": false} {
		if got := matches(quote, msgs[0]) || matches(quote, msgs[1]); got != want {
			t.Errorf("%q quotes the start of a message: %v, want %v", quote, got, want)
		}
	}
	drifted := Parse("docs/operations.md", "`cacheguard: bloom filter saturated, rebuild it`\n")
	problems, _, _ := CheckLogs([]*Doc{drifted}, msgs, "docs/operations.md")
	want := []string{
		`docs/operations.md:1: "cacheguard: bloom filter saturated, rebuild it": the code logs no such message and makes no such error ` +
			`(nearest: "cacheguard: bloom filter saturated; rebuild it")`,
		`drift/drift.go:6: WARN "cacheguard: bloom filter saturated; rebuild it" is quoted in no code span of docs/operations.md`,
	}
	if fmt.Sprint(problems) != fmt.Sprint(want) {
		t.Errorf("a changed message: %q, want %q", problems, want)
	}
}

func TestDriftOTel(t *testing.T) {
	files := map[string][]string{"guard/telemetry.go": {`tracer.Start(ctx, "cacheguard.Get")`, `meter.Int64Counter("cacheguard.gets")`}}
	problems, _ := CheckOTel([]*Doc{Parse("o.md", "`cacheguard.Get` and `cacheguard.get`\n")}, files)
	want := []string{
		"o.md:1: OpenTelemetry name cacheguard.get: guard's code has no such name (it has cacheguard.Get, cacheguard.gets)",
		"guard/telemetry.go:2: OpenTelemetry name cacheguard.gets is named in no code span of the docs",
	}
	if fmt.Sprint(problems) != fmt.Sprint(want) {
		t.Errorf("%q, want %q", problems, want)
	}
}

func TestParse(t *testing.T) {
	d := Parse("p.md", "a `one`\n\n- item:\n  ```Go title\n  x := 1\n    y\n  ```\n``two `x` spans\nlines`` and `unclosed\n\nnext`\n")
	if len(d.Blocks) != 1 || d.Blocks[0].Lang != "go" || d.Blocks[0].Line != 4 || fmt.Sprint(d.Blocks[0].Lines) != "[x := 1   y]" {
		t.Errorf("blocks %+v", d.Blocks)
	}
	if fmt.Sprint(d.Spans) != "[{p.md 1 one} {p.md 8 two `x` spans lines}]" {
		t.Errorf("spans %v", d.Spans)
	}
}
