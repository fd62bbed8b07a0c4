// Package chaos runs the whole deployment on one machine, as separate OS
// processes (three services with their Guards, the follower and a standby,
// the cacheguard command now and then, writers through the service and in
// SQL, readers of existing, new and never-existing IDs), under a fault
// schedule drawn from a seed, and checks the history every process recorded
// with a checker of its own (Check), which shares no code with the library.
//
// Each process appends its operations to a file, one JSON line each, as
// they happen (a SIGKILLed process loses none it finished): a read's start,
// end and answer, a write's intent before its commit and its version, WAL
// position and the Guard call's error after. The parent records the
// follower's confirmed position in PostgreSQL, whether Redis answered and
// its filter was ready, and each fault's times. Check applies the rule of
// the front page: a read that starts after a write took effect (its Guard
// call returned nil, or the follower confirmed its commit; plus the Local
// copy's window in a process with Local) answers that write's version or a
// later one, and an ID that exists is never "not found". make chaos runs it
// (TestChaos) and writes the report that docs/guarantees.md quotes.
package chaos
