#!/usr/bin/env bash
# The walk of one plain miss (scripts/missfiles' Get) through the library,
# traced with Delve: every call of a library function, in order, and each
# return to its caller. A stay is a run of calls and returns in one file; a
# return is a stay in a file already left; a climb is a call, within a
# stay, to a function defined above the one before it. ID=1 keeps only the
# calls that carry the ID (its text or its key among the arguments, or a
# Get's call, a flight or a miss as receiver): the walk of a Get's ID.
# VERBOSE=1 lists the stays. Needs dlv
# (go install github.com/go-delve/delve/cmd/dlv@latest).
set -euo pipefail
cd "$(dirname "$0")/.."
dlv=$(command -v dlv || echo "$(go env GOPATH)/bin/dlv")
[ -x "$dlv" ] || { echo "miss-walk: dlv not found: go install github.com/go-delve/delve/cmd/dlv@latest" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -cover -covermode=atomic -coverpkg=./... -gcflags=all='-N -l' -o "$tmp/missfiles" ./scripts/missfiles
mod=$(go list -m)
pkgs='guard|loader|lock|bloom|codec|internal.keyspace|internal.batch|internal.coord|internal.flightgroup'
cat >"$tmp/init" <<EOF
break main.plainMiss
continue
trace /cacheguard.cacheguard.($pkgs)\\./
break main.after
continue
exit
EOF
mkdir "$tmp/cov"
GOCOVERDIR="$tmp" "$dlv" exec "$tmp/missfiles" --init "$tmp/init" --allow-non-terminal-interactive=true -- "$tmp/cov" \
	>"$tmp/trace" 2>&1 </dev/null
git ls-files '*.go' | grep -v '_test.go$' >"$tmp/files"
python3 - "$tmp/trace" "$tmp/files" "$mod" <<'PY'
import os, re, sys, collections
trace, files, mod = sys.argv[1:]
only_id, verbose = os.environ.get("ID") == "1", os.environ.get("VERBOSE") == "1"
decl = re.compile(r"^func (?:\(\w* ?\*?(\w+)(?:\[[^\]]*\])?\) )?(\w+)")
where = {}  # import path + "." + [receiver type "."] + name -> (file, line)
for f in open(files).read().split():
    pkg = mod + "/" + os.path.dirname(f)
    for n, l in enumerate(open(f), 1):
        m = decl.match(l)
        if m:
            where[pkg + "." + (m.group(1) + "." if m.group(1) else "") + m.group(2)] = (f, n)
def name(text):  # the called function, generic instances and closures stripped
    out, depth = "", 0
    for i, ch in enumerate(text):
        if ch == "[": depth += 1; continue
        if ch == "]": depth -= 1; continue
        if depth: continue
        if ch == "(" and text[i:i+2] != "(*" and out and out[-1] not in "./": break
        out += ch
    out = out.replace("(*", "").replace(")", "")
    return re.sub(r"\.(func|gowrap)\d+(\.\d+)*$", "", out)
call = re.compile(r"^> goroutine\((\d+)\): (.*)$")
ret = re.compile(r"^>> goroutine\((\d+)\): =>")
stacks, events = collections.defaultdict(list), []
for l in open(trace):
    m = call.match(l)
    if m:
        at = where.get(name(m.group(2)))
        carries = '"77"' in l or "{77}" in l or re.search(r"\(\*(call|manyCall|flight|miss)\[", m.group(2))
        if only_id and not carries:
            at = None
        stacks[m.group(1)].append(at)
        if at:
            events.append((at, name(m.group(2)), True))
        continue
    m = ret.match(l)
    if m and stacks[m.group(1)]:
        stacks[m.group(1)].pop()
        back = next((a for a in reversed(stacks[m.group(1)]) if a), None)
        if back:
            events.append((back, "", False))
stays = []
for e in events:
    if stays and stays[-1][0] == e[0][0]:
        stays[-1][1].append(e)
    else:
        stays.append((e[0][0], [e]))
seen, returns, climbs = set(), 0, 0
for f, es in stays:
    returns += f in seen
    seen.add(f)
    last = None
    for (_, line), _, called in es:
        if called:
            climbs += last is not None and line < last
            last = line
    if verbose:
        print("  " + f + ": " + " ".join(sorted({n.split(".")[-1] for _, n, c in es if c})))
print(f"{len(stays)} stays in {len(seen)} files, {returns} returns to a file already left, {climbs} climbs back up")
PY
