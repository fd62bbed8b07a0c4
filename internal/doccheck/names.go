package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

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
