// Package adapters holds what the HTTP middlewares share (adapters/nethttp,
// adapters/echo for Echo v4, adapters/echov5, adapters/gin): the Rules a
// request's ID is judged by before the handler runs. Each middleware's
// options embed them. A middleware waits for Redis at most 100 ms (see
// guard.Guard.Peek): put request deadlines in the handler, around its Get.
package adapters

import "time"

// Rules say which IDs a middleware lets through and what it answers when
// Redis cannot. The zero value is the default.
type Rules struct {
	// Valid says whether an ID is well-formed; others get 400 before any
	// Redis command. Default: URL-unreserved characters (letters, digits,
	// '-', '.', '_', '~') plus ExtraIDChars. The Guard's limit (4,096 bytes) bounds
	// the length either way.
	Valid func(id string) bool
	// ExtraIDChars widens the default rule: "@+" for emails, ":" for
	// "user:1" (UUIDs, ULIDs, numbers and slugs need nothing).
	ExtraIDChars string
	// FailClosed answers 503 when Redis is unavailable (or did not answer
	// within Peek's 100 ms), instead of passing the request
	// through to the handler.
	FailClosed bool
	// RetryAfter is sent with every 503, from the middleware and from the
	// adapter's error rendering behind it. Default 1 second; whole seconds,
	// at least 1.
	RetryAfter time.Duration
	// OnUnfiltered, if set, is called for every request that reached a
	// route with path wildcards without an ID the middleware could read
	// (the wildcard is named otherwise, or the extractor found nothing):
	// such requests pass unfiltered, and a warning is logged once per route.
	OnUnfiltered func(route string)
}
