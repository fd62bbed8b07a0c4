module github.com/cacheguard/cacheguard/adapters/echov5

go 1.26.0

require github.com/cacheguard/cacheguard v0.0.0

require (
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
)

require (
	github.com/bits-and-blooms/bitset v1.29.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/labstack/echo/v5 v5.4.4
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)

// Developed beside the core: inside this repository the adapter builds
// against the core next to it. A replace applies only to the main module,
// so users get the core version required above (releases tag both:
// vX.Y.Z and adapters/echov5/vX.Y.Z).
replace github.com/cacheguard/cacheguard => ../..
