package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// Message is a line the code logs, or the text of an error it makes: "*"
// stands for each part that is not constant.
type Message struct {
	Level string // Debug, Info, Warn or Error; "error" for an error's text
	Text  string
	At    string
}

var levels = map[string]string{"Debug": "Debug", "Info": "Info", "Warn": "Warn", "Error": "Error",
	"DebugContext": "Debug", "InfoContext": "Info", "WarnContext": "Warn", "ErrorContext": "Error"}

// harness is code that runs only under tests: its lines are no user's.
var harness = regexp.MustCompile(`^(benchmarks|faults|chaos|scripts)/` +
	`|^internal/(redistest|redisserver|pgserver|testcert|redisfail|doccheck)/|/internal/adaptertest/`)

// Messages collects the slog calls' messages (x.Warn("..."), WarnContext
// too) and the errors.New and fmt.Errorf texts of the non-test code.
func Messages(files map[string][]string) ([]Message, error) {
	fset := token.NewFileSet()
	var out []Message
	var parsed []*ast.File
	passed := map[string]passedOn{} // funcs that log a parameter, by name
	for _, f := range keys(files) {
		if !strings.HasSuffix(f, ".go") || strings.HasSuffix(f, "_test.go") || harness.MatchString(f) {
			continue
		}
		file, err := parser.ParseFile(fset, f, strings.Join(files[f], "\n"), parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		parsed = append(parsed, file)
		pkgs := map[string]string{} // the file's imports by name: http.Error is no log call
		for _, im := range file.Imports {
			ip, _ := strconv.Unquote(im.Path.Value)
			name := path.Base(ip)
			if im.Name != nil {
				name = im.Name.Name
			}
			pkgs[name] = ip
		}
		var fn *ast.FuncDecl
		ast.Inspect(file, func(n ast.Node) bool {
			if d, ok := n.(*ast.FuncDecl); ok {
				fn = d
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			level, arg := levels[sel.Sel.Name], 0
			if strings.HasSuffix(sel.Sel.Name, "Context") {
				arg = 1
			}
			if x, ok := sel.X.(*ast.Ident); ok {
				switch ip := pkgs[x.Name]; {
				case ip == "errors" && sel.Sel.Name == "New", ip == "fmt" && sel.Sel.Name == "Errorf":
					level = "error"
				case ip != "" && ip != "log/slog":
					level = ""
				}
			}
			if level == "" || len(call.Args) <= arg {
				return true
			}
			if k := param(fn, call.Args[arg]); k >= 0 && level != "error" { // g.log.Warn(why): its callers say
				passed[fn.Name.Name] = passedOn{arg: k, level: level}
				return true
			}
			text := pattern(call.Args[arg])
			if level == "error" {
				text = verb.ReplaceAllString(text, "*")
			}
			if len(strings.ReplaceAll(text, "*", "")) >= 8 || text == "*" && (level == "Warn" || level == "Error") {
				out = append(out, Message{Level: level, Text: text, At: At(f, fset.Position(call.Pos()).Line)})
			}
			return true
		})
	}
	for _, file := range parsed { // the messages passed to funcs that log them
		ast.Inspect(file, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if p, ok := passed[baseName(call.Fun)]; ok && len(call.Args) > p.arg && pattern(call.Args[p.arg]) != "*" {
					out = append(out, Message{Level: p.level, Text: pattern(call.Args[p.arg]),
						At: At(fset.Position(call.Pos()).Filename, fset.Position(call.Pos()).Line)})
				}
			}
			return true
		})
	}
	return out, nil
}

// passedOn is a func that logs its parameter arg at level.
type passedOn struct {
	arg   int
	level string
}

// param is the index of fn's parameter that e names, -1 if none.
func param(fn *ast.FuncDecl, e ast.Expr) int {
	id, ok := e.(*ast.Ident)
	if !ok || fn == nil {
		return -1
	}
	k := 0
	for _, f := range fn.Type.Params.List {
		for _, n := range f.Names {
			if n.Name == id.Name {
				return k
			}
			k++
		}
		if len(f.Names) == 0 {
			k++
		}
	}
	return -1
}

var verb = regexp.MustCompile(`%[-+# 0-9.]*[a-zA-Z]`)

// pattern is a string expression's constant text, "*" for the rest.
func pattern(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
			return s
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return pattern(e.X) + pattern(e.Y)
		}
	case *ast.ParenExpr:
		return pattern(e.X)
	case *ast.Ident: // a constant declared beside the call
		if e.Obj == nil || e.Obj.Kind != ast.Con {
			break
		}
		if spec, ok := e.Obj.Decl.(*ast.ValueSpec); ok {
			for i, n := range spec.Names {
				if n.Name == e.Name && i < len(spec.Values) {
					return pattern(spec.Values[i])
				}
			}
		}
	}
	return "*"
}

// wild is a doc's or the code's text as a regexp, its wildcards (the
// code's *, the docs' ..., … and <placeholder>) matching anything.
var wildPart = regexp.MustCompile(`\*|\.\.\.|…|<[a-zA-Z_ -]+>`)

func wild(s string) *regexp.Regexp {
	var b strings.Builder
	last := 0
	for _, m := range wildPart.FindAllStringIndex(s, -1) {
		b.WriteString(regexp.QuoteMeta(s[last:m[0]]) + ".*")
		last = m[1]
	}
	b.WriteString(regexp.QuoteMeta(s[last:]))
	return regexp.MustCompile("^" + b.String() + "$")
}

// matches reports whether a quoted text and a message can be the same.
func matches(doc string, m Message) bool {
	if m.Text == "*" || !substantive(doc) { // all variable, or a quote of the prefix alone: not anything
		return doc == m.Text || doc == strings.TrimSuffix(m.Text, "*") && doc != ""
	}
	return doc == m.Text || wild(doc).MatchString(m.Text) || wild(m.Text).MatchString(doc) || starts(doc, m.Text)
}

var prefixes = regexp.MustCompile(`^([a-z][a-z-]*: )+`)

// substantive reports whether a quote says more than a prefix
// ("cacheguard: ...").
func substantive(doc string) bool {
	return strings.TrimSpace(prefixes.ReplaceAllString(wildPart.ReplaceAllString(doc, ""), "")) != ""
}

// starts reports whether doc quotes the start of msg up to a clause's end
// (a table of messages that "start with"): doc ends in : ; , or ( or msg
// goes on with one of them or a variable part.
func starts(doc, msg string) bool {
	if !strings.HasPrefix(msg, doc) || !prefixes.MatchString(doc) { // `cacheguard` is the command
		return false
	}
	d, rest := strings.TrimSpace(doc), strings.TrimLeft(msg[len(doc):], " ")
	return strings.ContainsAny(d[len(d)-1:], ":;,(") || rest == "" || strings.ContainsAny(rest[:1], ":;,(*")
}

var (
	logLine  = regexp.MustCompile(`level=(\w+) msg=("(?:[^"\\]|\\.)*"|\S+)`)
	textLine = regexp.MustCompile(`^\s*(?:\S+\s+)?(?:DEBUG|INFO|WARN|ERROR)\s+(\S.*?)(?:\s+[a-z_]+=.*)?$`) // slog's text, without keys
)

// LogPrefixes are how the messages start ("cacheguard: "): a code span
// that starts so quotes a message.
func LogPrefixes(msgs []Message) []string {
	seen := map[string]bool{}
	first := regexp.MustCompile(`^[a-z][a-z-]*: `)
	for _, m := range msgs {
		if p := first.FindString(m.Text); p != "" && m.Level != "error" {
			seen[p] = true
		}
	}
	return keys(seen)
}

// CheckLogs: each message the docs quote (a code span that starts with a
// prefix of LogPrefixes, a level=... msg=... line in a block) is one the
// code logs or an error it makes; each WARN and ERROR message is quoted in
// a code span of runbook (docs/operations.md). It returns the quotes it
// checked, and the WARN and ERROR messages.
func CheckLogs(docs []*Doc, msgs []Message, runbook string) (problems []string, quotes int, warns []Message) {
	prefixes := LogPrefixes(msgs)
	check := func(at, text string) {
		quotes++
		for _, m := range msgs {
			if matches(text, m) {
				return
			}
		}
		problems = append(problems, fmt.Sprintf("%s: %q: the code logs no such message and makes no such error%s", at, text, nearest(text, msgs)))
	}
	var runbookSpans []string
	for _, d := range docs {
		for _, s := range d.Spans {
			if d.Path == runbook {
				runbookSpans = append(runbookSpans, s.Text)
			}
			for _, p := range prefixes {
				if strings.HasPrefix(s.Text, p) {
					check(At(s.Path, s.Line), s.Text)
					break
				}
			}
		}
		for _, b := range d.Blocks {
			for i, l := range b.Lines {
				for _, m := range logLine.FindAllStringSubmatch(l, -1) {
					text := m[2]
					if u, err := strconv.Unquote(text); err == nil {
						text = u
					}
					check(At(b.Path, b.Line+1+i), text)
				}
				if m := textLine.FindStringSubmatch(l); m != nil && !logLine.MatchString(l) {
					for _, p := range prefixes {
						if strings.HasPrefix(m[1], p) {
							check(At(b.Path, b.Line+1+i), m[1])
							break
						}
					}
				}
			}
		}
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		if m.Level != "Warn" && m.Level != "Error" || seen[m.Level+m.Text] {
			continue
		}
		seen[m.Level+m.Text] = true
		warns = append(warns, m)
		if m.Text == "*" {
			continue // all variable: nothing to quote (TestDocsLogs lists it)
		}
		found := false
		for _, s := range runbookSpans {
			if matches(s, m) {
				found = true
				break
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s: %s %q is quoted in no code span of %s", m.At, strings.ToUpper(m.Level), m.Text, runbook))
		}
	}
	return problems, quotes, warns
}

// nearest names the message sharing the longest start with text.
func nearest(text string, msgs []Message) string {
	best, n := "", 0
	for _, m := range msgs {
		k := 0
		for k < len(text) && k < len(m.Text) && text[k] == m.Text[k] {
			k++
		}
		if k > n {
			best, n = m.Text, k
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (nearest: %q)", best)
}
