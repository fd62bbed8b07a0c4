package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// step is one element of a dotted name: Stats() is {Stats, true}.
type step struct {
	name string
	call bool
}

// chain flattens a selector expression (Stats().CorruptValues,
// guard.Options{...}.Local); ok is false for anything else.
func chain(e ast.Expr) ([]step, bool) {
	if x := unwrap(e); x != nil {
		return chain(x)
	}
	switch e := e.(type) {
	case *ast.Ident:
		return []step{{name: e.Name}}, true
	case *ast.SelectorExpr:
		s, ok := chain(e.X)
		return append(s, step{name: e.Sel.Name}), ok
	case *ast.CallExpr:
		s, ok := chain(e.Fun)
		if ok && len(s) > 0 && !s[len(s)-1].call {
			s[len(s)-1].call = true
			return s, true
		}
		return nil, false
	}
	return nil, false
}

// roots is what a dotted name's first element may be: a package of ours;
// else our types, fields, methods and funcs of that name (guard's first),
// those of outside types, which accept any selector, only if none is ours.
func (idx *Index) roots(s step) []target {
	if ps := idx.pkgs[s.name]; len(ps) > 0 && !s.call {
		var out []target
		for _, p := range ps {
			out = append(out, target{pkg: p, label: s.name})
		}
		return out
	}
	var types, members, outside []target
	paths := keys(idx.byPath)
	sort.SliceStable(paths, func(i, j int) bool { return paths[i] == module+"/guard" && paths[j] != module+"/guard" })
	for _, ip := range paths {
		p := idx.byPath[ip]
		if t := p.types[s.name]; t != nil && t.expr != nil && !s.call && ast.IsExported(s.name) {
			types = append(types, target{typ: t, label: s.name})
		}
		var found []target
		if f := p.funcs[s.name]; f != nil && ast.IsExported(s.name) {
			found = append(found, idx.call(target{fn: f, label: s.name}, s))
		}
		for _, tn := range keys(p.types) {
			if t := p.types[tn]; ast.IsExported(s.name) && t.expr != nil {
				if r, ok := idx.member(t, s.name, s.name, 0); ok {
					found = append(found, idx.call(r, s))
				}
			}
		}
		for _, r := range found {
			if r.ext {
				outside = append(outside, r)
			} else {
				members = append(members, r)
			}
		}
	}
	if len(types)+len(members) > 0 {
		return append(types, members...)
	}
	return outside
}

// call applies s's call, if any, to t: a func's first result.
func (idx *Index) call(t target, s step) target {
	if !s.call {
		return t
	}
	if t.fn == nil {
		if t.ext {
			return t
		}
		return target{basic: "not a func", label: t.label}
	}
	ft, ok := t.fn.expr.(*ast.FuncType)
	if !ok || ft.Results == nil || len(ft.Results.List) == 0 {
		return target{ext: t.fn.expr == nil, basic: "no result", label: t.label + "()"}
	}
	return idx.typeTarget(ft.Results.List[0].Type, t.fn, t.label+"()")
}

// selectOn resolves one step on t, or says why not.
func (idx *Index) selectOn(t target, s step) (target, string) {
	label := t.label + "." + s.name
	switch {
	case t.ext:
		return t, ""
	case t.pkg != nil:
		if tt := t.pkg.types[s.name]; tt != nil && tt.expr != nil && ast.IsExported(s.name) {
			return target{typ: tt, label: label}, ""
		}
		if f := t.pkg.funcs[s.name]; f != nil && ast.IsExported(s.name) {
			if _, isFunc := f.expr.(*ast.FuncType); isFunc {
				return idx.call(target{fn: f, label: label}, s), ""
			}
			return idx.call(idx.typeTarget(f.expr, f, label), s), ""
		}
		if testName.MatchString(s.name) && idx.Tests[s.name] {
			return target{ext: true, label: label}, ""
		}
		return target{}, fmt.Sprintf("package %s (%s) has no exported %s", t.pkg.name, strings.TrimPrefix(t.pkg.path, module+"/"), s.name)
	case t.typ != nil:
		if r, ok := idx.member(t.typ, s.name, label, 0); ok {
			return idx.call(r, s), ""
		}
		why := fmt.Sprintf("no field or method %s in %s.%s", s.name, t.typ.pkg.name, t.typ.name)
		if ps := idx.paths(t.typ, s.name, 0); len(ps) > 0 {
			why += fmt.Sprintf(" (did you mean %s.%s?)", t.label, strings.Join(ps, " or "+t.label+"."))
		}
		return target{}, why
	case t.fn != nil:
		return target{}, fmt.Sprintf("%s is a func: call it (%s()) before selecting %s", t.label, t.label, s.name)
	}
	return target{}, fmt.Sprintf("%s is a %s: no %s", t.label, t.basic, s.name)
}

// resolve checks a dotted name; it returns "" when one reading of it
// resolves, else why the first reading fails.
func (idx *Index) resolve(steps []step, vars map[string]bool) (why string, checked bool) {
	first := steps[0].name
	for _, e := range External {
		if first == e { // echo and gin too: the docs import our adapters as cgecho, cggin
			return "", false
		}
	}
	roots := idx.roots(steps[0])
	if len(roots) == 0 {
		if vars[first] {
			return "", false
		}
		if ast.IsExported(first) {
			return fmt.Sprintf("no package, type, field, func or method %s in our packages", first), true
		}
		return fmt.Sprintf("%s is no package of ours nor a known outside one (doccheck.External), "+
			"nor a variable the docs' Go blocks declare", first), true
	}
	for _, r := range roots {
		if r.basic == "not a func" {
			why = first + " is not a func"
			continue
		}
		t, w := r, ""
		for _, s := range steps[1:] {
			if t, w = idx.selectOn(t, s); w != "" {
				break
			}
		}
		if w == "" {
			return "", true
		}
		if why == "" || rank(w) > rank(why) {
			why = w
		}
	}
	return why, true
}

// rank orders the reasons a reading fails: the one that names what exists
// instead first.
func rank(why string) int {
	switch {
	case strings.Contains(why, "did you mean"):
		return 2
	case strings.HasPrefix(why, "no field or method"):
		return 1
	}
	return 0
}

// composite checks the keys of a composite literal of one of our types.
func (idx *Index) composite(lit *ast.CompositeLit, vars map[string]bool) []string {
	steps, ok := chain(lit.Type)
	if !ok {
		return nil
	}
	if why, _ := idx.resolve(steps, vars); why != "" {
		return nil // reported as a name
	}
	var out []string
	for _, r := range idx.roots(steps[0]) {
		t := r
		for _, s := range steps[1:] {
			t, _ = idx.selectOn(t, s)
		}
		if t.typ == nil {
			return nil
		}
		out = nil
		for _, e := range lit.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			if k, ok := kv.Key.(*ast.Ident); ok {
				if _, found := idx.member(t.typ, k.Name, "", 0); !found {
					out = append(out, fmt.Sprintf("%s{%s: ...}: no field %s in %s.%s", t.label, k.Name, k.Name, t.typ.pkg.name, t.typ.name))
				}
			}
		}
		if len(out) == 0 {
			return nil
		}
	}
	return out
}

var fileName = regexp.MustCompile(`\.(go|md|txt|json|png|svg|pdf|sql|conf|yaml|yml|sh|mod|sum|csv|html|js|css|pem|rdb|aof|lua)$`)

// importPath is an import path or a URL (github.com/..., redis://...).
var importPath = regexp.MustCompile(`^[a-z][\w.-]*\.[a-z]{2,}/|://`)

// AllowedNames are CamelCase names the docs may use bare that are not ours,
// each with where it is from.
var AllowedNames = map[string]string{
	"ContextTimeoutEnabled": "go-redis: redis.Options",
	"DialerRetries":         "go-redis: redis.Options",
	"MaxRetries":            "go-redis: redis.Options",
	"PoolSize":              "go-redis: redis.Options",
	"UseRawPath":            "gin: gin.Engine",
	"HTTPErrorHandler":      "echo: echo.Echo",
}

// CheckNames checks the Go names in the docs' code spans: dotted names are
// walked through our packages' fields, methods and results; bare CamelCase
// names must be exported somewhere in our packages (or tests, or
// AllowedNames). It returns how many names it checked.
func CheckNames(docs []*Doc, idx *Index) (problems []string, checked int) {
	vars := declared(docs)
	for _, d := range docs {
		for _, s := range d.Spans {
			text := strings.TrimSpace(s.Text)
			if fileName.MatchString(text) || otelName.MatchString(text) || strings.HasPrefix(text, "-") || importPath.MatchString(text) ||
				header.MatchString(text) {
				continue
			}
			e, err := parser.ParseExpr(strings.ReplaceAll(text, "...", "_"))
			if err != nil {
				continue
			}
			var found []string
			n := 0
			var visit func(ast.Node) bool
			visit = func(node ast.Node) bool {
				switch node := node.(type) {
				case *ast.FuncLit:
					return false // its body declares names of its own
				case *ast.CompositeLit:
					found = append(found, idx.composite(node, vars)...)
					if node.Type != nil {
						ast.Inspect(node.Type, visit)
					}
					for _, e := range node.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok {
							e = kv.Value // its key is a field: composite checked it
						}
						ast.Inspect(e, visit)
					}
					return false
				case *ast.Ident:
					if bare(node.Name) {
						n++
						if !idx.Names[node.Name] && !idx.Tests[node.Name] && AllowedNames[node.Name] == "" {
							found = append(found, node.Name+": no exported name, test or subtest of that name in our packages")
						}
					}
					return false
				case ast.Expr:
					steps, ok := chain(node)
					if !ok || len(steps) < 2 {
						return true
					}
					why, c := idx.resolve(steps, vars)
					if c {
						n++
					}
					if why != "" {
						found = append(found, dotted(steps)+": "+why)
					}
					for _, a := range args(node) { // the calls' arguments hold names too
						ast.Inspect(a, visit)
					}
					return false
				}
				return true
			}
			ast.Inspect(e, visit)
			checked += n
			for _, f := range found {
				problems = append(problems, At(s.Path, s.Line)+": "+f)
			}
		}
	}
	return problems, checked
}

// bare reports whether a lone identifier is a Go name to check: CamelCase,
// not an all-caps word (GET, NOPERM).
func bare(s string) bool {
	r := []rune(s)
	if len(r) < 2 || !unicode.IsUpper(r[0]) {
		return false
	}
	return strings.IndexFunc(s, unicode.IsLower) >= 0
}

// args is the arguments of the calls in a chain.
func args(e ast.Expr) []ast.Expr {
	if x := unwrap(e); x != nil {
		return args(x)
	}
	switch e := e.(type) {
	case *ast.SelectorExpr:
		return args(e.X)
	case *ast.CallExpr:
		return append(args(e.Fun), e.Args...)
	}
	return nil
}

func dotted(steps []step) string {
	var b strings.Builder
	for i, s := range steps {
		if i > 0 {
			b.WriteString(".")
		}
		b.WriteString(s.name)
		if s.call {
			b.WriteString("()")
		}
	}
	return b.String()
}

var assign = regexp.MustCompile(`(?m)(?:^|[\s(])((?:[a-z_]\w*\s*,\s*)*[a-z_]\w*)\s*:?=` +
	`|\bvar ([a-z_]\w*)|\bfunc\(([a-z]\w*)|\bfor (?:\w+, )?([a-z]\w*) :?= range`)

// declared is the variables the docs' Go blocks declare (g, products,
// rdb): a dotted name may start with one, unchecked.
func declared(docs []*Doc) map[string]bool {
	vars := map[string]bool{}
	for _, d := range docs {
		for _, b := range d.Blocks {
			if b.Lang != "go" {
				continue
			}
			for _, m := range assign.FindAllStringSubmatch(strings.Join(b.Lines, "\n"), -1) {
				for _, g := range m[1:] {
					for _, v := range strings.Split(g, ",") {
						if v = strings.TrimSpace(v); v != "" && v != "_" {
							vars[v] = true
						}
					}
				}
			}
		}
	}
	return vars
}
