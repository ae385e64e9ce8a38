#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the autotuner's shared-storage test and print
# its URL on stdout (everything else goes to stderr):
#
#   export NKI_KERNELS_TEST_PG_URL="$(scripts/ci_postgres.sh)"
#   ...
#   scripts/ci_postgres.sh stop          # stops the cluster started last and removes it
#
# Installs the server with apt-get if no initdb is found (needs root). The cluster lives
# in a fresh temp directory, listens on 127.0.0.1 only, trusts local connections, and is
# run as a non-root user (postgres refuses to run as root): the `postgres` system user
# when started as root, else the calling user.
set -euo pipefail

STATE_FILE="${TMPDIR:-/tmp}/nki-kernels-ci-postgres.state"
log() { echo "ci_postgres: $*" >&2; }

find_bindir() {
    if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
        pg_config --bindir
        return
    fi
    local d
    for d in /usr/lib/postgresql/*/bin /usr/local/pgsql/bin; do
        if [ -x "$d/initdb" ]; then echo "$d"; return; fi
    done
    if command -v initdb >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v initdb)")"; fi
}

as_owner() {
    if [ "$(id -u)" = "0" ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ "${1:-start}" = "stop" ]; then
    [ -f "$STATE_FILE" ] || { log "no cluster recorded in $STATE_FILE"; exit 0; }
    # shellcheck disable=SC1090
    . "$STATE_FILE"
    as_owner "$BINDIR/pg_ctl" -D "$DATA" -m fast -w stop >&2 || true
    rm -rf "$DATA" "$STATE_FILE"
    log "stopped and removed $DATA"
    exit 0
fi

BINDIR="$(find_bindir || true)"
if [ -z "$BINDIR" ]; then
    log "no PostgreSQL server binaries found; installing with apt-get"
    if [ "$(id -u)" != "0" ]; then log "apt-get needs root"; exit 1; fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    BINDIR="$(find_bindir)"
fi

if [ "$(id -u)" = "0" ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi

DATA="$(mktemp -d "${TMPDIR:-/tmp}/nki-kernels-pg.XXXXXX")"
if [ "$(id -u)" = "0" ]; then chown postgres "$DATA"; fi
chmod 700 "$DATA"

PORT="${NKI_KERNELS_PG_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"

as_owner "$BINDIR/initdb" -D "$DATA" -U postgres -A trust --no-sync >/dev/null
as_owner "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DATA -c fsync=off" start >&2

"$BINDIR/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
    -c "CREATE DATABASE nki_tune" >&2

printf 'BINDIR=%q\nDATA=%q\nPORT=%q\n' "$BINDIR" "$DATA" "$PORT" >"$STATE_FILE"
log "PostgreSQL on 127.0.0.1:$PORT, data in $DATA (stop: $0 stop)"
echo "postgresql://postgres@127.0.0.1:$PORT/nki_tune"
