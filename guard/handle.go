package guard

import (
	"context"
	"errors"
)

// Cache is a Guard bound to one value type and one load function: the shape
// of "wrapping repository calls". Its Get has the repository's own signature
// for string IDs, so a repository method can be swapped for a cached one in
// one line:
//
//	products, err := guard.For(g, repo.FindProduct) // FindProduct(ctx, id string) (Product, error)
//	find := products.Get                             // same signature, now cached
//
// and its write methods keep the cache right through a row's life: Add
// after INSERT, Set (or Invalidate) after UPDATE, Delete after DELETE. It
// adds nothing to the Guard's guarantees and removes none.
type Cache[T any] struct {
	g    *Guard
	load LoadFunc[T]
}

// For binds g to T and returns its typed handle. A Guard serves one type:
// For (or Get) with another T on the same Guard fails with ErrWrongType.
func For[T any](g *Guard, load LoadFunc[T]) (*Cache[T], error) {
	if g == nil || load == nil {
		return nil, errors.New("cacheguard: For needs a non-nil Guard and load function")
	}
	if err := bind[T](g); err != nil {
		return nil, err
	}
	return &Cache[T]{g: g, load: load}, nil
}

// Guard returns the Guard behind c.
func (c *Cache[T]) Guard() *Guard { return c.g }

// Get is guard.Get with c's load function.
func (c *Cache[T]) Get(ctx context.Context, id string) (T, error) { return Get(ctx, c.g, id, c.load) }

// Set is guard.Set: write v through after the source of truth committed it.
func (c *Cache[T]) Set(ctx context.Context, id string, v T) error { return Set(ctx, c.g, id, v) }

// Add is Guard.Add: after the source of truth created ids.
func (c *Cache[T]) Add(ctx context.Context, ids ...string) error { return c.g.Add(ctx, ids...) }

// Invalidate is Guard.Invalidate: after the source of truth changed ids.
func (c *Cache[T]) Invalidate(ctx context.Context, ids ...string) error {
	return c.g.Invalidate(ctx, ids...)
}

// Delete is Guard.Delete: after the source of truth deleted ids.
func (c *Cache[T]) Delete(ctx context.Context, ids ...string) error { return c.g.Delete(ctx, ids...) }
