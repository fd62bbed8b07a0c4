package nethttp_test

import (
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/cacheguard/cacheguard/adapters"
	"github.com/cacheguard/cacheguard/adapters/internal/adaptertest"
	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
)

// TestAdapter runs the suite every adapter passes (adaptertest).
func TestAdapter(t *testing.T) { adaptertest.Run(t, stdlib{}) }

// stdlib builds the suite's routers with http.ServeMux and this adapter.
type stdlib struct{ *http.ServeMux }

var wildcard = regexp.MustCompile(`:(\w+)`)

// pattern is path (Echo syntax) as a ServeMux pattern: "/things/:sku" is
// "GET /things/{sku}".
func pattern(path string) string { return "GET " + wildcard.ReplaceAllString(path, "{$1}") }

// middleware is the adapter with c; net/http has no Skipper, so a skipped
// request goes around it.
func middleware(g *guard.Guard, c adaptertest.Config) func(http.Handler) http.Handler {
	mw := nethttp.Middleware(g, &nethttp.Options{Rules: adapters.Rules{FailClosed: c.FailClosed, RetryAfter: c.RetryAfter, OnUnfiltered: c.OnUnfiltered}})
	if c.SkipHeader == "" {
		return mw
	}
	return func(next http.Handler) http.Handler {
		guarded := mw(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(c.SkipHeader) != "" {
				next.ServeHTTP(w, r)
				return
			}
			guarded.ServeHTTP(w, r)
		})
	}
}

func (stdlib) New(g *guard.Guard, c adaptertest.Config, get func(r *http.Request, id string) (string, error)) adaptertest.Router {
	mux := http.NewServeMux()
	mux.Handle(pattern("/products/:id"), middleware(g, c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, err := get(r, r.PathValue("id"))
		if err != nil {
			nethttp.Error(w, r, err)
			return
		}
		_, _ = io.WriteString(w, name)
	})))
	return stdlib{mux}
}

func (s stdlib) OK(path string, g *guard.Guard, c adaptertest.Config) {
	s.Handle(pattern(path), middleware(g, c)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
}
