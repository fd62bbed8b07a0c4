#!/usr/bin/env bash
# Runs the parts of make test that do not depend on one another at once:
# each argument is "name: command", run by bash in the repository's root.
# Most of their time is spent waiting (on Redis, on child processes, on a
# fault's period), so on 2 cores they overlap well. Each part's output is
# printed as one block, with its time, when it ends; the script fails if
# any part failed, after all have ended.
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pids=() names=()
for part in "$@"; do
	name=${part%%:*} cmd=${part#*:}
	names+=("$name")
	(
		start=$SECONDS
		bash -c "$cmd" >"$tmp/$name.out" 2>&1
		rc=$?
		echo "== $name: exit $rc after $((SECONDS - start)) s" >>"$tmp/$name.out"
		exit $rc
	) &
	pids+=($!)
done
failed=()
for i in "${!pids[@]}"; do
	wait "${pids[$i]}" || failed+=("${names[$i]}")
done
for name in "${names[@]}"; do
	echo "==== $name"
	cat "$tmp/$name.out"
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "together: failed: ${failed[*]}" >&2
	exit 1
fi
