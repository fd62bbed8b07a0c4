#!/usr/bin/env bash
# Source hygiene that gofmt and vet do not check (make test runs it):
#   - no line over 160 characters, no comment line over 100;
#   - no doc comment over 15 lines in non-test code (details go to docs/);
#   - no library comment that reads as a lab note (a machine, a VM, a
#     median): measurements belong in docs/ (benchmarks/, examples/ and
#     faults/ measure, and may say so);
#   - no tracked file over 1 MB (build outputs do not belong in git): data
#     that must be larger is listed in scripts/large-files.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.go')
code=$(git ls-files '*.go' | grep -v '_test\.go$')
bad=0
long=$(awk 'length($0) > 160 { print FILENAME ":" FNR ": line of " length($0) " characters" }
	/^[ \t]*\/\// && length($0) > 100 { print FILENAME ":" FNR ": comment line of " length($0) " characters" }' $files)
docs=$(awk '/^[ \t]*\/\// { if (!run) start = FNR; run++; next }
	{ if (run > 15) print FILENAME ":" start ": comment of " run " lines"; run = 0 }' $code)
lab=$(echo "$code" | grep -Ev '^(benchmarks|examples|faults)/' | xargs grep -nE '//.*\b(VM|Intel|AMD|EPYC|[Mm]edian|this machine)\b' || true)
allowed=$(cat scripts/large-files.txt 2>/dev/null || true)
big=$(git ls-files -z | xargs -0 -r du -k 2>/dev/null | awk '$1 > 1024 { print $2 }' | grep -vxF "${allowed:-/}" |
	sed 's/$/: tracked file over 1 MB (not listed in scripts\/large-files.txt)/' || true)
for report in "$long" "$docs" "$lab" "$big"; do
	if [ -n "$report" ]; then echo "$report"; bad=1; fi
done
if [ $bad = 1 ]; then
	echo "check-source: see above (scripts/check-source.sh says what it checks)"
	exit 1
fi
