#!/usr/bin/env bash
# progress.sh WHAT CMD...: runs CMD and, while it runs, prints a line every
# 10 s saying that WHAT is still under way, so that a first `make demo`
# (which downloads and compiles the shop's modules for minutes) never looks
# hung. Exits with CMD's status.
set -u
what=$1
shift
"$@" &
pid=$!
start=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 1
    kill -0 "$pid" 2>/dev/null || break 2
  done
  echo "demo: still $what ($((SECONDS - start)) s; a first run downloads and compiles the Go modules)"
done
wait "$pid"
