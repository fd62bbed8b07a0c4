package pgfollow

import "time"

// InspectRoom is how many samples the inspector queues at most.
const InspectRoom = inspectPending

// InspectPending counts the samples waiting for their checks (0: off).
func InspectPending(f *Follower) int {
	if f.insp == nil {
		return 0
	}
	f.insp.mu.Lock()
	defer f.insp.mu.Unlock()
	return f.insp.pending()
}

// InspectNow makes every queued sample of f due now, for tests that need
// the checks made after an incident rather than at their delays.
func InspectNow(f *Follower) {
	in := f.insp
	in.mu.Lock()
	now := time.Now()
	for _, q := range in.queues {
		for i := range q {
			q[i].due = now
		}
	}
	in.mu.Unlock()
	select {
	case in.wake <- struct{}{}:
	default:
	}
}
