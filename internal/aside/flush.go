package aside

import "context"

// flush waits until the flights, refresh-ahead reloads, lock releases and
// loads under way in this process have ended, or until ctx is done (it then
// returns ctx's error): tests call it (through guard's export_test.go)
// instead of sleeping. A Get that served a value past its refresh-at time
// returns before the reload it started, and a caller that left on its own
// ctx leaves its flight running; after flush those have written what they
// loaded, or given up. Close waits for these too (the supervisor).
func (g *Engine) flush(ctx context.Context) error { return g.sup.idle(ctx) }
