// Package clone makes deep copies of a type's values, with a copier built
// once per type from reflect (guard's in-process cache hands each caller its
// own copy). Strings and time.Time values are shared; slices, maps and
// pointers get fresh storage. For reports a type it cannot copy safely (see
// docs/design.md), and values must be trees (no pointer cycle).
package clone

import (
	"reflect"
	"sync"
	"time"
)

// For returns a function that deep-copies values of T. shareable is true
// when a plain assignment already copies everything (no slice, map or
// pointer inside): fn is then nil, and callers can hand out the value as
// it is. ok is false when T cannot be copied safely (see the package doc).
func For[T any]() (fn func(T) T, shareable, ok bool) {
	c, ok := build(reflect.TypeFor[T](), map[reflect.Type]*pending{})
	switch {
	case !ok:
		return nil, false, false
	case c == nil:
		return nil, true, true
	}
	return func(v T) T {
		// One allocation holds both: reflect needs addressable values.
		p := new([2]T)
		p[0] = v
		c(reflect.ValueOf(&p[1]).Elem(), reflect.ValueOf(&p[0]).Elem())
		return p[1]
	}, false, true
}

// copier copies src into dst, a settable value of the same type.
type copier func(dst, src reflect.Value)

// pending is a copier still being built: the types inside a recursive type
// reach it through a thunk.
type pending struct{ c copier }

var timeType = reflect.TypeFor[time.Time]()

// built caches build's answer per type: building walks the type once.
var built sync.Map // reflect.Type → result

type result struct {
	c  copier
	ok bool
}

// build returns the copier of t: nil when assignment suffices, ok false
// when t cannot be copied safely. inProgress holds the types being built
// further up (recursion).
func build(t reflect.Type, inProgress map[reflect.Type]*pending) (copier, bool) {
	if r, ok := built.Load(t); ok {
		return r.(result).c, r.(result).ok
	}
	if p, ok := inProgress[t]; ok { // recursive: t's copier, once it is built
		return func(dst, src reflect.Value) { p.c(dst, src) }, true
	}
	p := &pending{}
	inProgress[t] = p
	c, ok := buildKind(t, inProgress)
	delete(inProgress, t)
	p.c = c
	if c == nil && ok {
		p.c = func(dst, src reflect.Value) { dst.Set(src) }
	}
	if len(inProgress) == 0 { // a complete answer (no thunk waits on an outer type)
		built.Store(t, result{c, ok})
	}
	return c, ok
}

func buildKind(t reflect.Type, inProgress map[reflect.Type]*pending) (copier, bool) {
	if t == timeType {
		return nil, true
	}
	switch t.Kind() {
	case reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return nil, false
	case reflect.Array:
		ec, ok := build(t.Elem(), inProgress)
		if !ok || ec == nil || t.Len() == 0 {
			return nil, ok
		}
		return func(dst, src reflect.Value) {
			for i := range src.Len() {
				ec(dst.Index(i), src.Index(i))
			}
		}, true
	case reflect.Struct:
		return buildStruct(t, inProgress)
	case reflect.Slice:
		ec, ok := build(t.Elem(), inProgress)
		if !ok {
			return nil, false
		}
		return nilable(func(dst, src reflect.Value) {
			n := src.Len()
			s := reflect.MakeSlice(t, n, n)
			if ec == nil {
				reflect.Copy(s, src)
			} else {
				for i := range n {
					ec(s.Index(i), src.Index(i))
				}
			}
			dst.Set(s)
		}), true
	case reflect.Map:
		if kc, ok := build(t.Key(), inProgress); !ok || kc != nil {
			return nil, false // keys with pointers inside: their identity is the key
		}
		vc, ok := build(t.Elem(), inProgress)
		if !ok {
			return nil, false
		}
		return nilable(func(dst, src reflect.Value) {
			m := reflect.MakeMapWithSize(t, src.Len())
			it := src.MapRange()
			for it.Next() {
				if vc == nil {
					m.SetMapIndex(it.Key(), it.Value())
					continue
				}
				v := reflect.New(t.Elem()).Elem()
				vc(v, it.Value())
				m.SetMapIndex(it.Key(), v)
			}
			dst.Set(m)
		}), true
	case reflect.Pointer:
		ec, ok := build(t.Elem(), inProgress)
		if !ok {
			return nil, false
		}
		return nilable(func(dst, src reflect.Value) {
			p := reflect.New(t.Elem())
			if ec == nil {
				p.Elem().Set(src.Elem())
			} else {
				ec(p.Elem(), src.Elem())
			}
			dst.Set(p)
		}), true
	}
	return nil, true // booleans, numbers, strings
}

// nilable is the copier of a slice, map or pointer, c, with a nil source
// copied as nil (an empty slice or map stays empty, not nil).
func nilable(c copier) copier {
	return func(dst, src reflect.Value) {
		if src.IsNil() {
			dst.SetZero()
			return
		}
		c(dst, src)
	}
}

// buildStruct copies the struct by assignment, then gives the exported
// fields that hold slices, maps or pointers storage of their own. An
// unexported field must be a plain value: the copier cannot set it.
func buildStruct(t reflect.Type, inProgress map[reflect.Type]*pending) (copier, bool) {
	type field struct {
		i int
		c copier
	}
	var deep []field
	for i := range t.NumField() {
		f := t.Field(i)
		c, ok := build(f.Type, inProgress)
		switch {
		case !ok:
			return nil, false
		case c == nil:
		case !f.IsExported():
			return nil, false
		default:
			deep = append(deep, field{i, c})
		}
	}
	if len(deep) == 0 {
		return nil, true
	}
	return func(dst, src reflect.Value) {
		dst.Set(src)
		for _, f := range deep {
			f.c(dst.Field(f.i), src.Field(f.i))
		}
	}, true
}
