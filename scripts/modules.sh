#!/usr/bin/env bash
# Runs one command in several module directories at once, then prints each
# one's output in the order given, headed "== dir", and fails if any
# failed. make test runs the adapters' modules and others this way: their
# tests mostly wait on servers of their own (a frozen Redis), so together
# they take about as long as the slowest one.
#
# Usage: scripts/modules.sh 'command' dir...
set -uo pipefail
cmd=$1
shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
for dir in "$@"; do
	(cd "$dir" && eval "$cmd") >"$out/${#pids[@]}" 2>&1 &
	pids+=($!)
done
rc=0
i=0
for dir in "$@"; do
	wait "${pids[$i]}" || rc=1
	echo "== $dir"
	cat "$out/$i"
	i=$((i + 1))
done
exit $rc
