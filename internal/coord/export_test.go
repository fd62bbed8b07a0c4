package coord

// TripsWaiting is how many of c's flights' round trips wait to be sent
// (see runTrips), for tests that hold one and queue others behind it.
func TripsWaiting(c *Coordinator) int { return c.trips.Waiting() }
