package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// Go blocks -----------------------------------------------------------------

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

// The packages' names --------------------------------------------------------

// Index is the exported surface of the repository's importable packages,
// as go/ast sees it, and the names of its tests.
type Index struct {
	pkgs   map[string][]*pkg // by package name and by doc alias (cgecho)
	byPath map[string]*pkg
	Names  map[string]bool // exported types, funcs, vars, consts, fields, methods
	Tests  map[string]bool // Test, Example, Benchmark, Fuzz funcs; t.Run names
}

type pkg struct {
	name, path string
	types      map[string]*typ
	funcs      map[string]*ref // top-level funcs, vars and consts
}

type typ struct {
	pkg     *pkg
	name    string
	expr    ast.Expr
	imports map[string]string
	methods map[string]*ref
}

// ref is a declared thing's type expression, in the file that declares it.
type ref struct {
	pkg     *pkg
	expr    ast.Expr // nil: unknown (a var without a type)
	imports map[string]string
}

const module = "github.com/cacheguard/cacheguard"

// Aliases are the import names the docs give packages of ours.
var Aliases = map[string][]string{
	"cgecho": {module + "/adapters/echov5", module + "/adapters/echo"},
	"cggin":  {module + "/adapters/gin"},
}

// External are package names the docs may use that are not ours: a name
// after them is not checked.
var External = strings.Fields(`redis http slog otel prometheus promhttp collectors gin echo sql errors context time fmt
	chi pgx pgxpool pgconn os io strings sync iter maps slices log json trace metric sdkmetric sdktrace otelprom
	signal atomic testing math rand runtime pprof flag net url tls bytes strconv exec sort filepath errgroup
	goleak otter gobreaker msgpack xxhash bitset httptest cache rueidis syscall`)

// importable reports whether a tracked file is in a package the docs may
// name: any but commands (package main), internal ones included.
func importable(file string) bool { return !strings.HasSuffix(file, "_test.go") }

// header is an HTTP header's name (Retry-After), which parses as a
// subtraction.
var header = regexp.MustCompile(`^[A-Z][a-z]+(-[A-Z][a-z]+)+$`)

var tRun = regexp.MustCompile(`\bt\.Run\("([A-Za-z0-9_]+)"`)

// NewIndex parses files (as TrackedGo gives them).
func NewIndex(files map[string][]string) (*Index, error) {
	idx := &Index{pkgs: map[string][]*pkg{}, byPath: map[string]*pkg{}, Names: map[string]bool{}, Tests: map[string]bool{}}
	fset := token.NewFileSet()
	var parsed []*ast.File
	var owners []*pkg
	var names []string
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		src := strings.Join(files[f], "\n")
		for _, m := range tRun.FindAllStringSubmatch(src, -1) {
			idx.Tests[m[1]] = true
		}
		if !strings.HasSuffix(f, "_test.go") && !importable(f) {
			continue
		}
		file, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(f, "_test.go") {
			for _, d := range file.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && testName.MatchString(fd.Name.Name) {
					idx.Tests[fd.Name.Name] = true
				}
			}
			continue
		}
		if file.Name.Name == "main" {
			continue
		}
		p := idx.byPath[module+"/"+path.Dir(f)]
		if p == nil {
			p = &pkg{name: file.Name.Name, path: module + "/" + path.Dir(f), types: map[string]*typ{}, funcs: map[string]*ref{}}
			idx.byPath[p.path] = p
			idx.pkgs[p.name] = append(idx.pkgs[p.name], p)
		}
		parsed, owners = append(parsed, file), append(owners, p)
	}
	for a, paths := range Aliases {
		for _, ip := range paths {
			if p := idx.byPath[ip]; p != nil {
				idx.pkgs[a] = append(idx.pkgs[a], p)
			}
		}
	}
	for i, file := range parsed {
		idx.declare(owners[i], file)
	}
	return idx, nil
}

var testName = regexp.MustCompile(`^(Test|Example|Benchmark|Fuzz)[A-Z_]`)

func (idx *Index) declare(p *pkg, file *ast.File) {
	imports := map[string]string{}
	for _, im := range file.Imports {
		ip, _ := strconv.Unquote(im.Path.Value)
		name := path.Base(ip)
		if strings.HasPrefix(name, "v") && strings.Count(ip, "/") > 2 { // .../go-redis/v9
			if _, err := strconv.Atoi(name[1:]); err == nil {
				name = path.Base(path.Dir(ip))
			}
		}
		if im.Name != nil {
			name = im.Name.Name
		}
		imports[name] = ip
	}
	typeOf := func(name string) *typ {
		t := p.types[name]
		if t == nil {
			t = &typ{pkg: p, name: name, methods: map[string]*ref{}, imports: imports}
			p.types[name] = t
		}
		return t
	}
	export := func(n string) {
		if ast.IsExported(n) {
			idx.Names[n] = true
		}
	}
	for _, d := range file.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			export(d.Name.Name)
			r := &ref{pkg: p, expr: d.Type, imports: imports}
			if d.Recv == nil {
				p.funcs[d.Name.Name] = r
			} else {
				typeOf(baseName(d.Recv.List[0].Type)).methods[d.Name.Name] = r
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					export(s.Name.Name)
					t := typeOf(s.Name.Name)
					t.expr, t.imports = s.Type, imports
					ast.Inspect(s.Type, func(n ast.Node) bool {
						if f, ok := n.(*ast.Field); ok {
							for _, n := range f.Names {
								export(n.Name)
							}
							if len(f.Names) == 0 {
								export(baseName(f.Type))
							}
						}
						return true
					})
				case *ast.ValueSpec:
					for _, n := range s.Names {
						export(n.Name)
						p.funcs[n.Name] = &ref{pkg: p, expr: s.Type, imports: imports}
					}
				}
			}
		}
	}
}

// unwrap is the expression inside a pointer, parentheses or type
// arguments; nil for any other.
func unwrap(e ast.Expr) ast.Expr {
	switch e := e.(type) {
	case *ast.StarExpr:
		return e.X
	case *ast.ParenExpr:
		return e.X
	case *ast.IndexExpr:
		return e.X
	case *ast.IndexListExpr:
		return e.X
	}
	return nil
}

// baseName is the name of a receiver's or an embedded field's type.
func baseName(e ast.Expr) string {
	if x := unwrap(e); x != nil {
		return baseName(x)
	}
	switch e := e.(type) {
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// target is what a name resolves to.
type target struct {
	pkg   *pkg
	typ   *typ
	fn    *ref // a func or method: its results, once called
	ext   bool // outside our packages, or of unknown type: not checked further
	basic string
	label string // the path so far, for messages
}

// typeTarget resolves a type expression declared in r's file.
func (idx *Index) typeTarget(e ast.Expr, r *ref, label string) target {
	if x := unwrap(e); x != nil {
		return idx.typeTarget(x, r, label)
	}
	switch e := e.(type) {
	case nil:
		return target{ext: true, label: label}
	case *ast.Ident:
		if t := r.pkg.types[e.Name]; t != nil && t.expr != nil {
			return target{typ: t, label: label}
		}
		if e.Name == "error" || e.Name == "any" {
			return target{ext: true, label: label}
		}
		return target{basic: e.Name, label: label}
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			if p := idx.byPath[r.imports[x.Name]]; p != nil {
				if t := p.types[e.Sel.Name]; t != nil && t.expr != nil {
					return target{typ: t, label: label}
				}
			}
		}
		return target{ext: true, label: label}
	case *ast.StructType, *ast.InterfaceType:
		return target{typ: &typ{pkg: r.pkg, name: label, expr: e, imports: r.imports, methods: map[string]*ref{}}, label: label}
	case *ast.FuncType:
		return target{fn: &ref{pkg: r.pkg, expr: e, imports: r.imports}, label: label}
	case *ast.ArrayType:
		return target{basic: "slice", label: label}
	case *ast.MapType:
		return target{basic: "map", label: label}
	}
	return target{ext: true, label: label}
}

// member finds name among t's fields (embedded ones' too) and methods.
func (idx *Index) member(t *typ, name string, label string, depth int) (target, bool) {
	if depth > 6 || t == nil {
		return target{}, false
	}
	if m := t.methods[name]; m != nil {
		return target{fn: m, label: label}, true
	}
	self := &ref{pkg: t.pkg, imports: t.imports}
	switch e := t.expr.(type) {
	case *ast.StructType, *ast.InterfaceType:
		var fields []*ast.Field
		if s, ok := e.(*ast.StructType); ok {
			fields = s.Fields.List
		} else {
			fields = e.(*ast.InterfaceType).Methods.List
		}
		for _, f := range fields {
			for _, n := range f.Names {
				if n.Name == name {
					return idx.typeTarget(f.Type, self, label), true
				}
			}
		}
		for _, f := range fields { // promoted through embedded fields
			if len(f.Names) > 0 {
				continue
			}
			if baseName(f.Type) == name {
				return idx.typeTarget(f.Type, self, label), true
			}
			inner := idx.typeTarget(f.Type, self, label)
			if inner.ext {
				return target{ext: true, label: label}, true // an embedded outside type may have it
			}
			if r, ok := idx.member(inner.typ, name, label, depth+1); ok {
				return r, true
			}
		}
	default: // type T U: U's fields
		if u := idx.typeTarget(e, self, label); u.typ != nil {
			return idx.member(u.typ, name, label, depth+1)
		}
	}
	return target{}, false
}

// paths lists where name is in t's nested fields, as selector paths
// (Telemetry.TracerProvider), for a "did you mean".
func (idx *Index) paths(t *typ, name string, depth int) []string {
	s, ok := t.expr.(*ast.StructType)
	if !ok || depth > 3 {
		return nil
	}
	var out []string
	for _, f := range s.Fields.List {
		inner := idx.typeTarget(f.Type, &ref{pkg: t.pkg, imports: t.imports}, "")
		if inner.typ == nil {
			continue
		}
		fieldName := baseName(f.Type)
		if len(f.Names) > 0 {
			fieldName = f.Names[0].Name
		}
		if _, ok := idx.member(inner.typ, name, "", 0); ok {
			out = append(out, fieldName+"."+name)
			continue
		}
		for _, p := range idx.paths(inner.typ, name, depth+1) {
			out = append(out, fieldName+"."+p)
		}
	}
	return out
}

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

// OpenTelemetry -------------------------------------------------------------

var otelName = regexp.MustCompile(`^cacheguard\.[A-Za-z_][A-Za-z0-9_.]*$`)

// CheckOTel: the OpenTelemetry names the docs quote (spans, instruments,
// attributes: `cacheguard.gets`) are string literals of guard's telemetry,
// and each of those is quoted somewhere.
func CheckOTel(docs []*Doc, files map[string][]string) (problems []string, checked int) {
	lit := regexp.MustCompile(`"(cacheguard\.[A-Za-z_][A-Za-z0-9_.]*)"`)
	code := map[string]string{}
	for f, lines := range files {
		if !strings.HasPrefix(f, "guard/") || strings.HasSuffix(f, "_test.go") || strings.Count(f, "/") != 1 {
			continue
		}
		for i, l := range lines {
			for _, m := range lit.FindAllStringSubmatch(l, -1) {
				code[m[1]] = At(f, i+1)
			}
		}
	}
	quoted := map[string]bool{}
	for _, d := range docs {
		for _, s := range d.Spans {
			if !otelName.MatchString(s.Text) {
				continue
			}
			checked++
			quoted[s.Text] = true
			if code[s.Text] == "" {
				problems = append(problems, fmt.Sprintf("%s: OpenTelemetry name %s: guard's code has no such name (it has %s)",
					At(s.Path, s.Line), s.Text, strings.Join(keys(code), ", ")))
			}
		}
	}
	for _, n := range keys(code) {
		if !quoted[n] {
			problems = append(problems, fmt.Sprintf("%s: OpenTelemetry name %s is named in no code span of the docs", code[n], n))
		}
	}
	return problems, checked
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Log messages ---------------------------------------------------------------

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
