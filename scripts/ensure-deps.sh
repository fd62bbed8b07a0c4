#!/usr/bin/env bash
# Installs what `make test`, `make demo` and `make bench` need when it is
# missing: redis-server and redis-cli, and PostgreSQL for the shop's test of
# its PostgreSQL path (Debian packages). Go modules come from the Go module
# proxy through the go command itself.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-deps: missing ${need[*]}; install them (sudo apt-get install -y ${need[*]}) and run again" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-deps: missing ${need[*]} and no apt-get here; install redis-server 7+ by hand" >&2
  exit 1
fi
echo "ensure-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The package may start a system service on 6379; our tests start their own
# servers and do not use it.
redis-server --version
