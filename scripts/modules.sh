#!/usr/bin/env bash
# Runs commands in several module directories at once, then prints each
# one's output in the order given, headed "== dir", and fails if any
# failed. make test runs the side modules this way: their tests mostly wait
# on servers of their own (a frozen Redis, PostgreSQL), so side by side they
# take about as long as the slowest one, and a module built meanwhile (the
# fault suite, run alone afterwards) takes the cores they leave idle.
#
# Usage: scripts/modules.sh 'command' dir... [-- 'command' dir...]...
set -uo pipefail
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
	wait "${pids[$i]}" || rc=1
	echo "== ${dirs[$i]}"
	cat "$out/$i"
done
exit $rc
