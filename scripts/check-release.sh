#!/usr/bin/env bash
# The release check: a user who `go get`s one module of this repository
# alone gets a build that works. It serves the working tree as version
# $V from a file-based module proxy (the root module, and each side module
# with its go.mod requiring the root at $V instead of the local replace),
# and builds a program importing each side module from a fresh module.
# Other modules come from the usual proxy. Release steps: docs/design.md.
# It builds with -race, as make test compiles everything before it: the
# dependencies come from that compile instead of being compiled once more.
set -euo pipefail
cd "$(dirname "$0")/.."
V=${V:-v1.0.0-rc.check}
root=github.com/cacheguard/cacheguard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
proxy=$work/proxy
python3 - "$proxy" "$V" "$root" <<'PY'
import os, subprocess, sys, zipfile, json, re
proxy, v, root = sys.argv[1:]
files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True, check=True).stdout.split()
files = [f for f in files if os.path.exists(f)]
mods = sorted({os.path.dirname(f) for f in files if os.path.basename(f) == "go.mod"})
def publish(moddir):
    path = root if moddir == "" else root + "/" + moddir
    inner = [d for d in mods if d != moddir and (moddir == "" or d.startswith(moddir + "/"))]
    d = os.path.join(proxy, path, "@v"); os.makedirs(d, exist_ok=True)
    gomod = open(os.path.join(moddir or ".", "go.mod")).read()
    gomod = re.sub(r"(?m)^replace .*$", "", gomod)
    gomod = gomod.replace(root + " v0.0.0", root + " " + v)
    with zipfile.ZipFile(os.path.join(d, v + ".zip"), "w") as z:
        for f in files:
            rel = f if moddir == "" else (f[len(moddir) + 1:] if f.startswith(moddir + "/") else None)
            if rel is None or any(f.startswith(i + "/") for i in inner) or "/testdata/" in "/" + rel:
                continue
            data = gomod.encode() if rel == "go.mod" else open(f, "rb").read()
            z.writestr(path + "@" + v + "/" + rel, data)
    open(os.path.join(d, v + ".mod"), "w").write(gomod)
    open(os.path.join(d, v + ".info"), "w").write(json.dumps({"Version": v, "Time": "2026-12-01T00:00:00Z"}))
    open(os.path.join(d, "list"), "w").write(v + "\n")
for m in mods:
    if m == "" or m.startswith("adapters/") or m in ("guardprometheus", "follow/postgres"):
        publish(m)
PY
export GOPROXY="file://$proxy,$(go env GOPROXY)" GONOSUMDB=$root GOFLAGS=-mod=mod
for m in adapters/echo adapters/echov5 adapters/gin guardprometheus follow/postgres; do
	dir=$work/use-$(basename "$m")
	mkdir -p "$dir"
	pkg=$(cd "$m" && go list -f '{{.ImportPath}}' .)
	(cd "$dir" && go mod init example.com/use >/dev/null 2>&1 &&
		printf 'package main\n\nimport _ "%s"\n\nfunc main() {}\n' "$pkg" >main.go &&
		go get "$pkg@$V" >/dev/null 2>&1 && go build -race ./...) ||
		{ echo "check-release: a module that requires only $pkg@$V does not build"; exit 1; }
	echo "check-release: $pkg@$V builds on its own"
done
