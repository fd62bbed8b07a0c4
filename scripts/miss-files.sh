#!/usr/bin/env bash
# Lists the library files that one plain miss runs through (a Get of a known,
# uncached ID on a warm Guard), by coverage: scripts/missfiles makes the Get
# between clearing and writing the counters. MAX=n fails when more than n
# files (or a file over 500 lines) are on the path.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -cover -covermode=atomic -coverpkg=./... -o "$tmp/missfiles" ./scripts/missfiles
mkdir "$tmp/cov"
GOCOVERDIR="$tmp" "$tmp/missfiles" "$tmp/cov"
go tool covdata textfmt -i "$tmp/cov" -o "$tmp/cov.txt"
mod=$(go list -m)
files=$(awk 'NR > 1 && $NF > 0 { sub(/:.*/, "", $1); print $1 }' "$tmp/cov.txt" | sed "s|^$mod/||" |
	grep -v '^scripts/' | sort -u)
n=0 long=0
for f in $files; do
	lines=$(wc -l <"$f")
	printf '%5d  %s\n' "$lines" "$f"
	n=$((n + 1))
	[ "$lines" -gt 500 ] && long=$((long + 1))
done
echo "$n files on the path of a miss"
if [ -n "${MAX:-}" ] && { [ "$n" -gt "$MAX" ] || [ "$long" -gt 0 ]; }; then
	echo "miss-files: more than $MAX files, or a file over 500 lines" >&2
	exit 1
fi
