#!/usr/bin/env bash
# Installs the Debian packages a make target needs when they are missing,
# and nothing more:
#
#   ensure-deps.sh demo   redis-server and redis-cli (make demo, make quickstart, make bench)
#   ensure-deps.sh test   the above, redis-sentinel (the fault suite's failover),
#                         PostgreSQL (the shop's PostgreSQL test) and chromium
#                         (the dashboard's browser test): make test
#
# Go modules come from the Go module proxy through the go command itself.
# Every step says what it does: a first run on a fresh machine installs
# packages and downloads modules for a minute or two.
set -euo pipefail

profile=${1:-test}
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
case "$profile" in
demo) ;;
test)
  command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
  ;;
*)
  echo "ensure-deps: unknown profile $profile (want demo or test)" >&2
  exit 2
  ;;
esac
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-deps: missing ${need[*]}; install them (sudo apt-get install -y ${need[*]}) and run again" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-deps: missing ${need[*]} and no apt-get here; install them by hand (redis-server 7+)" >&2
  exit 1
fi
echo "ensure-deps: installing ${need[*]} (apt-get; about a minute on a fresh machine)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The package may start a system service on 6379; our tests start their own
# servers and do not use it.
echo "ensure-deps: installed; $(redis-server --version | cut -d' ' -f1-3)"
