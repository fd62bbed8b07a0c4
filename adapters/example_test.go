package adapters_test

import (
	"fmt"
	"net/http"

	"github.com/cacheguard/cacheguard/adapters"
	"github.com/cacheguard/cacheguard/adapters/nethttp"
)

// Each middleware's options embed Rules: its fields read as the options' own.
func ExampleRules() {
	opts := &nethttp.Options{Param: "email", Rules: adapters.Rules{ExtraIDChars: "@+.", FailClosed: true}}
	fmt.Println(opts.Param, opts.ExtraIDChars, opts.FailClosed)
	_ = http.NewServeMux() // mux.Handle("GET /users/{email}", nethttp.Middleware(g, opts)(handler))
	// Output: email @+. true
}
