// Package doccheck holds the user docs (README.md and docs/*.md) to the
// code: their Go blocks are copies of compiled files, and the names, metric
// names, flags and log messages they quote exist. The whole-docs tests are
// in this package's tests; the modules that serve metrics or own commands
// check theirs with the helpers here.
package doccheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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
