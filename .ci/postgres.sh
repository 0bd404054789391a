#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on loopback for the awaken-store conformance suite.
#
#   eval "$(bash .ci/postgres.sh start)"   # exports AWAKEN_TEST_POSTGRES_URL and AWAKEN_TEST_POSTGRES_DIR
#   bash .ci/postgres.sh restart "$AWAKEN_TEST_POSTGRES_DIR"   # a fast restart, same options
#   bash .ci/postgres.sh stop "$AWAKEN_TEST_POSTGRES_DIR"   # stops the cluster, removes its files
#
# `start` installs Debian's `postgresql` package when no `initdb` is found, creates a cluster
# under a fresh /tmp directory (trust auth, loopback only, fsync off: test data only), starts it
# on the first free port from $AWAKEN_PG_PORT (default 25432: below the kernel's ephemeral
# ports, which a client's connection may hold when the server binds, or rebinds on a restart),
# creates the database `awaken_test`, and prints only `export` lines on stdout (everything else
# goes to stderr).
# As root, the server runs as the `postgres` user (initdb refuses root).
set -euo pipefail

log() { printf 'postgres.sh: %s\n' "$*" >&2; }

find_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [[ -n "$dir" && -x "$dir/initdb" ]]; then
    echo "$dir"
  elif command -v initdb >/dev/null 2>&1; then
    dirname "$(command -v initdb)"
  fi
}

as_pg() {
  if [[ "$(id -u)" == 0 ]]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  local bin
  bin=$(find_bin)
  if [[ -z "$bin" ]]; then
    log "initdb not found; installing PostgreSQL from Debian's packages"
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql >&2
    bin=$(find_bin)
    [[ -n "$bin" ]] || { log "initdb still missing after the install"; exit 1; }
  fi
  local port=${AWAKEN_PG_PORT:-25432} tries=0
  while ! port_free "$port"; do
    port=$((port + 1)); tries=$((tries + 1))
    [[ $tries -lt 20 ]] || { log "no free port near ${AWAKEN_PG_PORT:-25432}"; exit 1; }
  done
  local dir
  dir=$(mktemp -d /tmp/awaken-pg.XXXXXX)
  chmod 755 "$dir"
  if [[ "$(id -u)" == 0 ]]; then chown postgres:postgres "$dir"; fi
  as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    start >&2 || { cat "$dir/server.log" >&2; exit 1; }
  as_pg "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres awaken_test >&2
  log "$("$bin/postgres" --version) on 127.0.0.1:$port, data in $dir"
  echo "export AWAKEN_TEST_POSTGRES_URL='postgresql://postgres@127.0.0.1:$port/awaken_test'"
  echo "export AWAKEN_TEST_POSTGRES_DIR='$dir'"
}

restart() {
  local dir=${1:-${AWAKEN_TEST_POSTGRES_DIR:-}}
  [[ -n "$dir" && -d "$dir/data" ]] || { log "nothing to restart (no cluster dir given)"; exit 1; }
  local bin
  bin=$(find_bin)
  [[ -n "$bin" ]] || { log "pg_ctl not found"; exit 1; }
  # Fast: open connections are cut off. pg_ctl starts the server again with the options it was
  # started with (postmaster.opts); its output goes on to the same log file.
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w -t 60 restart >&2 \
    || { tail -n 20 "$dir/server.log" >&2; exit 1; }
}

stop() {
  local dir=${1:-${AWAKEN_TEST_POSTGRES_DIR:-}}
  [[ -n "$dir" && -d "$dir/data" ]] || { log "nothing to stop (no cluster dir given)"; return 0; }
  local bin
  bin=$(find_bin)
  as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
  rm -rf "$dir"
}

case "${1:-start}" in
  start) start ;;
  restart) restart "${2:-}" ;;
  stop) stop "${2:-}" ;;
  *) log "usage: $0 start | restart [dir] | stop [dir]"; exit 2 ;;
esac
