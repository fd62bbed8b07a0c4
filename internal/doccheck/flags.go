// Package doccheck holds the user docs (README.md and docs/*.md) to the
// code: their Go blocks are copies of compiled files, and the names, metric
// names, flags and log messages they quote exist. The whole-docs tests are
// in this package's tests; the modules that serve metrics or own commands
// check theirs with the helpers here (issue 62).
package doccheck

import (
	"fmt"
	"regexp"
	"strings"
)

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
