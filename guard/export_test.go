package guard

// ReadsWaiting is how many of g's reads wait for a round trip (see
// runReads), for tests that hold one and queue others behind it.
func ReadsWaiting(g *Guard) int { return g.readBatch.Waiting() }
