//go:build !unix

package cputime

import "time"

// Process returns 0: getrusage is a unix call.
func Process() time.Duration { return 0 }
