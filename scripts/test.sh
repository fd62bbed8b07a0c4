#!/usr/bin/env bash
# make test's stages, after the gofmt and source checks (the Makefile).
#
# The tests run one stage after another: run at once on 2 cores they starved
# each other into timeouts. Only builds overlap them: while the root's tests
# run (mostly waiting on Redis and child processes), the later stages' builds
# run in the background at the lowest priority, so that each stage finds its
# compile done. A stage waits for its build first; a build that fails fails
# make test, and make test ending or interrupted stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

# Parallel tests (the slow ones that use their own keys or servers) run 4
# at a time: most of their time is waiting on Redis and child processes.
# -vet=all is go vet's whole set, run on the race build's own compile (a
# separate go vet compiled every package once more).
TEST="$GO test -race -vet=all -count=1 -parallel 4"
# A stage's test build alone: compiled and vetted as TEST does (the same
# build cache entries), and not run.
BUILD="$GO test -race -vet=all -count=1 -exec true"

# Modules of their own beside the root (so the root module needs neither Echo, Gin,
# Prometheus nor pgx), vetted and tested like the root.
SIDE_MODULES="adapters/echo adapters/echov5 adapters/gin guardprometheus follow/postgres"

# The Redis-facing packages, run a second time on a private Redis Cluster
# (CG_TEST_CLUSTER=1). In guard that pass runs only the tests marked
# clusterToo(t) (guard/cluster_test.go); the standalone pass runs them all.
# A test that starts a cluster of its own and fails it over is in faults/.
CLUSTER_PKGS="./bloom ./lock ./loader ./internal/coord ./guard ./internal/cputime"

logs=$(mktemp -d)
pids=()
stop() {
	for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
	rm -rf "$logs"
}
trap stop EXIT
trap 'exit 130' INT TERM HUP

# ahead NAME SCRIPT: runs SCRIPT in the background at the lowest priority,
# in a process group of its own (setsid) so that stop ends all of it.
ahead() {
	local setsid
	setsid=$(command -v setsid || true)
	$setsid nice -n 19 bash -euc "$2" >"$logs/$1" 2>&1 &
	pids+=($!)
	printf -v "pid_$1" %s $!
}

# await NAME: waits for the background build NAME and prints its output;
# it failing fails make test.
await() {
	local pid=pid_$1 rc=0 start=$SECONDS
	wait "${!pid}" || rc=$?
	cat "$logs/$1"
	echo "== waited $((SECONDS - start)) s for the background build '$1'"
	if [ $rc != 0 ]; then
		echo "make test: the background build '$1' failed (exit $rc)"
		exit $rc
	fi
}

# stage NAME CMD...: runs a stage in the foreground and says how long it took.
stage() {
	local start=$SECONDS
	echo "== $1"
	shift
	"$@"
	echo "== done in $((SECONDS - start)) s"
}

side=""
for m in $SIDE_MODULES; do side+="(cd $m && $BUILD ./... >/dev/null); "; done
ahead side "$side"
# The shop (modernc.org/sqlite, a large pure-Go package, is most of it).
ahead shop "cd examples/shop && $BUILD ./... >/dev/null"
# faults/' build; benchmarks/ is only built (and vetted), and the release
# check only builds (scripts/check-release.sh): they run here whole.
ahead rest "(cd faults && $BUILD ./... >/dev/null); (cd benchmarks && $TEST -run '^\$' ./...); ./scripts/check-release.sh"

stage "go test ./... (root module)" $TEST -timeout 15m ./...
await side
for m in $SIDE_MODULES; do
	stage "$m" bash -c "cd $m && $TEST -timeout 5m ./..."
done
await shop
stage "examples/shop" bash -c "cd examples/shop && $TEST -timeout 10m ./..."
stage "the Redis-facing packages on a Redis Cluster" env CG_TEST_CLUSTER=1 $TEST -timeout 15m $CLUSTER_PKGS
await rest
stage "faults" bash -c "cd faults && FAULTS_TABLE=$PWD/faults/latest.md $TEST -timeout 10m ./..."
cat faults/latest.md
