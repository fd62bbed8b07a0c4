// Package chaos runs the whole deployment on one machine as OS processes
// (three services with their Guards, the follower and a standby, the
// cacheguard command, writers through the service and in SQL, readers of
// existing, new and never-existing IDs) under a fault schedule drawn from a
// seed, and checks the history every process recorded with Check, which
// shares no code with the library.
//
// A process appends each operation to its file as it happens (a SIGKILL
// loses none it finished): a read's start, end and answer, a write's intent
// before its commit and its version and WAL position after. The parent
// records the follower's confirmed position, whether Redis answered and its
// filter was ready, and each fault. Check applies the front page's rule
// with the documented windows (Rules); make chaos runs it (TestChaos) and
// writes the report that docs/guarantees.md quotes.
package chaos
