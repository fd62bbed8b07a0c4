package main

import (
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/cacheguard/cacheguard/guard"
)

// route is one of the shop's Echo routes, written once for both Echo
// versions: echo4.go and echo5.go register the same list, each with its
// own adapter in front of the guarded ones.
type route struct {
	method, path string       // path in Echo syntax: /products/:id
	guarded      *guard.Guard // not nil: the adapter's middleware filters :id with it
	handle       func(r *http.Request, id string) reply
}

// reply is what a route answers: JSON (a value or bytes), no content, or
// an error that each router maps with its adapter (see reply.write).
type reply struct {
	status int
	value  any    // encoded as JSON
	raw    []byte // JSON as is
	err    error
}

// status is an error answered with its code and the framework's own body
// (validation of the request, not a cache outcome).
type status struct {
	code int
	msg  string
}

func (e *status) Error() string { return strconv.Itoa(e.code) + " " + e.msg }

func fail(err error) reply { return reply{err: err} }

func ok(code int, v any) reply { return reply{status: code, value: v} }

// readProduct decodes a product from a request body (at most 64 KiB).
func readProduct(r *http.Request) (Product, error) {
	var in Product
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&in); err != nil || in.Name == "" {
		return in, &status{code: http.StatusBadRequest, msg: `want {"name": ..., "price_cents": ...}`}
	}
	return in, nil
}

// routes are the Echo routes: the guarded product reads and writes, the
// demo's variants, the eviction used by the stampede scenario, and the
// naive baseline.
func (s *Shop) routes() []route {
	rs := []route{
		{"GET", "/products/:id", s.products, func(r *http.Request, id string) reply {
			p, err := s.productCache.Get(r.Context(), id)
			if err != nil {
				return fail(err)
			}
			return ok(http.StatusOK, p)
		}},
		{"POST", "/products", nil, func(r *http.Request, _ string) reply {
			in, err := readProduct(r)
			if err != nil {
				return fail(err)
			}
			p, err := s.writes.CreateProduct(r.Context(), in.Name, in.PriceCents)
			if err != nil {
				return fail(err)
			}
			if err := s.created(r.Context(), p.ID); err != nil {
				return fail(err)
			}
			return ok(http.StatusCreated, p)
		}},
		{"PUT", "/products/:id", s.products, func(r *http.Request, id string) reply {
			in, err := readProduct(r)
			if err != nil {
				return fail(err)
			}
			in.ID = id
			if err := s.writes.UpdateProduct(r.Context(), in); err != nil {
				return fail(err)
			}
			// Committed: write the new row through, so no reader pays a miss.
			if err := s.productCache.Set(r.Context(), in.ID, in); err != nil {
				return fail(err)
			}
			if err := s.naiveRDB.Del(r.Context(), naiveKey(in.ID)).Err(); err != nil {
				return fail(err)
			}
			return ok(http.StatusOK, in)
		}},
		{"DELETE", "/products/:id", s.products, func(r *http.Request, id string) reply {
			if err := s.writes.DeleteProduct(r.Context(), id); err != nil {
				return fail(err)
			}
			// Committed: every process answers 404 from a marker at once.
			if err := s.productCache.Delete(r.Context(), id); err != nil {
				return fail(err)
			}
			if err := s.naiveRDB.Del(r.Context(), naiveKey(id)).Err(); err != nil {
				return fail(err)
			}
			return reply{status: http.StatusNoContent}
		}},
		// Drops a product's cached copies on both paths, as an expiry would
		// (the demo's stampede scenario; an operator's "evict").
		{"DELETE", "/cache/products/:id", nil, func(r *http.Request, id string) reply {
			if err := s.evict(r.Context(), id); err != nil {
				return fail(err)
			}
			return reply{status: http.StatusNoContent}
		}},
		// The baseline: plain cache-aside, no filter, no markers, no lock.
		{"GET", "/naive/products/:id", nil, func(r *http.Request, id string) reply {
			ctx := r.Context()
			if _, err := strconv.ParseUint(id, 10, 64); err != nil { // product IDs are numbers
				return fail(&status{code: http.StatusBadRequest, msg: "malformed id"})
			}
			key := naiveKey(id)
			if raw, err := s.naiveRDB.Get(ctx, key).Bytes(); err == nil {
				return reply{status: http.StatusOK, raw: raw}
			}
			p, err := s.naiveStore.Product(ctx, id)
			if err != nil {
				return fail(err) // sql.ErrNoRows: 404
			}
			raw, _ := json.Marshal(p)
			s.naiveRDB.Set(ctx, key, raw, 10*time.Minute)
			return reply{status: http.StatusOK, raw: raw}
		}},
	}
	for _, v := range s.variants {
		rs = append(rs, route{"GET", v.prefix + ":id", v.g, func(r *http.Request, id string) reply {
			p, err := v.cache.Get(r.Context(), id)
			if err != nil {
				return fail(err)
			}
			return ok(http.StatusOK, p)
		}})
	}
	return rs
}

// responder is what both Echo versions' contexts can answer with.
type responder interface {
	JSONBlob(code int, b []byte) error
	JSON(code int, v any) error
	NoContent(code int) error
}

// write answers rp on c; a route's error goes through m, the
// router's mapping to its framework: notFound for a missing row, request
// for a request error (code, msg), adapter for everything else (the
// adapter's HTTPError: cache outcomes and failures).
func (rp reply) write(c responder, m errorMapping) error {
	var st *status
	switch {
	case rp.err != nil && errors.As(rp.err, &st):
		return m.request(st.code, st.msg)
	case rp.err != nil && errors.Is(rp.err, sql.ErrNoRows): // no such product
		return m.notFound()
	case rp.err != nil:
		return m.adapter(rp.err)
	case rp.raw != nil:
		return c.JSONBlob(rp.status, rp.raw)
	case rp.value != nil:
		return c.JSON(rp.status, rp.value)
	}
	return c.NoContent(rp.status)
}

// errorMapping turns a route's errors into a framework's.
type errorMapping struct {
	request  func(code int, msg string) error
	notFound func() error
	adapter  func(err error) error
}
