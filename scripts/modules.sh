#!/usr/bin/env bash
# Runs commands in several module directories at once, then prints each
# one's output in the order given, headed "== dir", and fails if any
# failed; with -q, only the output of the commands that failed. make test
# builds the side modules this way, all at once, then runs their tests side
# by side: they mostly wait on servers of their own (a frozen Redis,
# PostgreSQL), so together they take about as long as the slowest one, and
# no test waits while another module compiles.
#
# Usage: scripts/modules.sh [-q] 'command' dir... [-- 'command' dir...]...
set -uo pipefail
quiet=
if [ "${1:-}" = -q ]; then
	quiet=1
	shift
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
dirs=() pids=()
while [ $# -gt 0 ]; do
	cmd=$1
	shift
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do
		(cd "$1" && eval "$cmd") >"$out/${#dirs[@]}" 2>&1 &
		pids+=($!) dirs+=("$1")
		shift
	done
	[ $# -gt 0 ] && shift # the "--"
done
rc=0
for i in "${!dirs[@]}"; do
	failed=
	wait "${pids[$i]}" || failed=1
	if [ -n "$failed" ] || [ -z "$quiet" ]; then
		echo "== ${dirs[$i]}"
		cat "$out/$i"
	fi
	[ -n "$failed" ] && rc=1
done
exit $rc
