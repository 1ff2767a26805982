#!/usr/bin/env bash
# Run a command with a throwaway PostgreSQL server, then stop the server and remove its files.
#
#   scripts/with_postgres.sh [--durable] [--optional] COMMAND [ARGS...]
#
# Installs Debian's `postgresql` package if the server's programs are missing (root only), makes
# a cluster in a temp folder, starts it on 127.0.0.1 on a free port, creates a database and runs
# COMMAND with ORCHESTRATOR_TEST_POSTGRES_DSN set to it. The server is stopped and its folder
# removed when COMMAND ends, whatever its outcome (also on Ctrl+C); the exit code is COMMAND's.
#
#   --durable   the server's durable defaults (for benchmarks); without it fsync and
#               synchronous_commit are off, which only a throwaway test server may do.
#   --optional  if the server cannot be started, run COMMAND without it (the DSN unset) after
#               saying why; without it the script fails (CI: the PostgreSQL tests never skip).
#
# As root (CI), the server runs as the `postgres` user the package creates (PostgreSQL refuses
# to run as root); as anyone else, as that user.
set -euo pipefail

durable=0
optional=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --durable) durable=1; shift ;;
        --optional) optional=1; shift ;;
        --) shift; break ;;
        -*) echo "with_postgres.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [[ $# -eq 0 ]]; then
    echo "usage: scripts/with_postgres.sh [--durable] [--optional] COMMAND [ARGS...]" >&2
    exit 2
fi

say() { echo "with_postgres.sh: $*" >&2; }

# The folder of initdb and pg_ctl: Debian keeps them off PATH, in /usr/lib/postgresql/VERSION/bin.
find_bindir() {
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
            echo "$dir"
            return 0
        fi
    done
    if command -v pg_config >/dev/null 2>&1; then
        dir="$(pg_config --bindir)"
        if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
            echo "$dir"
            return 0
        fi
    fi
    dir="$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")"
    if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
        echo "$dir"
        return 0
    fi
    return 1
}

install_server() {
    if [[ "$(id -u)" -ne 0 ]]; then
        say "PostgreSQL is not installed, and only root can install it: sudo apt-get install postgresql"
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        say "PostgreSQL is not installed, and this is not a Debian-like system (no apt-get)"
        return 1
    fi
    say "installing Debian's postgresql package ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null \
        && apt-get install -y -qq --no-install-recommends postgresql >/dev/null
}

# Start the server; on success set folder, port, dsn and stop_server. Everything it starts is
# stopped by stop_server, which the EXIT trap calls.
folder=""
bindir=""
data=""
run_as=()
start_server() {
    if ! bindir="$(find_bindir)"; then
        install_server || return 1
        bindir="$(find_bindir)" || { say "the postgresql package has no initdb"; return 1; }
    fi
    folder="$(mktemp -d "${TMPDIR:-/tmp}/orchestrator-pg.XXXXXX")"
    if [[ "$(id -u)" -eq 0 ]]; then
        id postgres >/dev/null 2>&1 || { say "no postgres user (the package makes it)"; return 1; }
        chown postgres: "$folder"
        run_as=(su postgres -s /bin/sh -c)
    else
        run_as=(sh -c)
    fi
    chmod 700 "$folder"
    data="$folder/data"
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    local settings="-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$folder"
    settings="$settings -c max_connections=200"
    if [[ $durable -eq 0 ]]; then
        settings="$settings -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    fi
    # cd /: the postgres user may not be allowed into the caller's folder.
    "${run_as[@]}" "cd / && '$bindir/initdb' -D '$data' -A trust -U postgres --no-sync -E UTF8 \
        >'$folder/initdb.log' 2>&1" || { say "initdb failed:"; cat "$folder/initdb.log" >&2; return 1; }
    "${run_as[@]}" "cd / && '$bindir/pg_ctl' -D '$data' -l '$folder/server.log' -w -t 60 \
        start -o '$settings' >/dev/null" || { say "the server did not start:"; cat "$folder/server.log" >&2; return 1; }
    stop_server() {
        "${run_as[@]}" "cd / && '$bindir/pg_ctl' -D '$data' -m immediate -w stop >/dev/null 2>&1" || true
    }
    "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres orchestrator \
        || { say "could not create the database"; return 1; }
    dsn="postgresql://postgres@127.0.0.1:$port/orchestrator"
}

stop_server() { :; }
cleanup() {
    stop_server
    if [[ -n "$folder" ]]; then
        rm -rf "$folder"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

started=$SECONDS
if start_server; then
    say "PostgreSQL on 127.0.0.1:$port ($([[ $durable -eq 1 ]] && echo durable || echo 'fsync off'), $((SECONDS - started)) s to start)"
    export ORCHESTRATOR_TEST_POSTGRES_DSN="$dsn"
elif [[ $optional -eq 1 ]]; then
    say "PostgreSQL could not be started here: running without it (its rows are skipped)"
    unset ORCHESTRATOR_TEST_POSTGRES_DSN
else
    say "PostgreSQL could not be started: the PostgreSQL tests cannot run (see above)"
    exit 1
fi
# Not exec: the trap must stop the server when the command ends.
status=0
"$@" || status=$?
exit $status
