package doccheck

import (
	"fmt"
	"sort"
	"strings"
)

// Origin is where a Go block's lines are in the tracked Go files.
type Origin struct {
	Block Block
	File  string // "" when the block is no copy
	Line  int    // of the block's first line in File
}

// CheckBlocks: every go block of the docs is a copy of consecutive lines of
// one of files (their common indentation and trailing spaces aside; a line
// "..." stands for lines left out, the parts in order in the same file).
func CheckBlocks(docs []*Doc, files map[string][]string) (origins []Origin, problems []string) {
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, d := range docs {
		for _, b := range d.Blocks {
			if b.Lang != "go" {
				continue
			}
			o := Origin{Block: b}
			for _, f := range names {
				if line, ok := copyOf(b.Lines, files[f]); ok {
					o.File, o.Line = f, line
					break
				}
			}
			if o.File == "" {
				problems = append(problems, fmt.Sprintf("%s: go block of %d lines is no copy of a tracked Go file%s",
					At(b.Path, b.Line), len(b.Lines), closest(b.Lines, names, files)))
			}
			origins = append(origins, o)
		}
	}
	return origins, problems
}

// parts splits a block at its "..." lines, each part without its trailing
// spaces and trailing blank lines.
func parts(block []string) [][]string {
	var out [][]string
	var cur []string
	flush := func() {
		for len(cur) > 0 && cur[len(cur)-1] == "" {
			cur = cur[:len(cur)-1]
		}
		for len(cur) > 0 && cur[0] == "" {
			cur = cur[1:]
		}
		if len(cur) > 0 {
			out = append(out, cur)
		}
		cur = nil
	}
	for _, l := range block {
		l = strings.TrimRight(l, " \t")
		if t := strings.TrimSpace(l); t == "..." || t == "// ..." {
			flush()
			continue
		}
		cur = append(cur, l)
	}
	flush()
	return out
}

// copyOf reports whether block's parts are in src in order, each a run of
// consecutive lines under one indentation; line is the first part's line.
func copyOf(block, src []string) (line int, ok bool) {
	ps := parts(block)
	if len(ps) == 0 {
		return 0, false
	}
	from := 0
	for k, p := range ps {
		at := find(p, src, from)
		if at < 0 {
			return 0, false
		}
		if k == 0 {
			line = at + 1
		}
		from = at + len(p)
	}
	return line, true
}

// find is the first index at or after from where part is in src, -1 if none.
func find(part, src []string, from int) int {
	first := strings.TrimLeft(part[0], " \t")
	indentOf := len(part[0]) - len(first)
next:
	for i := from; i+len(part) <= len(src); i++ {
		s := strings.TrimRight(src[i], " \t")
		if !strings.HasSuffix(s, first) || strings.TrimLeft(s[:len(s)-len(first)], " \t") != "" ||
			len(s)-len(first) < indentOf {
			continue
		}
		indent := s[:len(s)-len(first)-indentOf] // what the source adds to every line
		for k, l := range part {
			s := strings.TrimRight(src[i+k], " \t")
			if l == "" && s == "" {
				continue
			}
			if s != indent+l {
				continue next
			}
		}
		return i
	}
	return -1
}

// closest says which file holds most of the block's lines, and the first
// line that differs from it, for the message.
func closest(block []string, names []string, files map[string][]string) string {
	best, bestN := "", 0
	for _, f := range names {
		have := map[string]bool{}
		for _, l := range files[f] {
			have[strings.TrimSpace(l)] = true
		}
		n := 0
		for _, l := range block {
			if t := strings.TrimSpace(l); t != "" && have[t] {
				n++
			}
		}
		if n > bestN {
			best, bestN = f, n
		}
	}
	if bestN == 0 {
		return " (none holds any of its lines)"
	}
	have := map[string]bool{}
	for _, l := range files[best] {
		have[strings.TrimSpace(l)] = true
	}
	for _, l := range block {
		if t := strings.TrimSpace(l); t != "" && t != "..." && !have[t] {
			return fmt.Sprintf(" (closest: %s, %d of its lines; not there: %q)", best, bestN, t)
		}
	}
	return fmt.Sprintf(" (closest: %s holds every line, not in this order: cut the block at \"...\" lines)", best)
}
