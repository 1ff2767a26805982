#!/usr/bin/env bash
# Make sure Node.js and the official protocol clients the adapter tests run are installed.
#
#   scripts/ensure_node_clients.sh
#
# Installs Debian's `nodejs` and `npm` packages if `node` or `npm` is missing (root only, like
# scripts/ensure_chromium.sh), then the npm packages pinned in tests/apps/node/package-lock.json
# (`npm ci`) into a cache folder, ORCHESTRATOR_NODE_CLIENTS (default .cache/node-clients),
# linked as tests/apps/node/node_modules. Nothing is installed again while the lock file is the
# same. This is the only step that reaches the npm registry: the tests talk to 127.0.0.1 only.
# The tests never skip when the clients are missing: they fail naming this script.
set -euo pipefail

say() { echo "ensure_node_clients.sh: $*" >&2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
source_dir="$root/tests/apps/node"
cache="${ORCHESTRATOR_NODE_CLIENTS:-$root/.cache/node-clients}"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [[ "$(id -u)" -ne 0 ]]; then
        say "Node.js is not installed, and only root can install it: sudo apt-get install nodejs npm"
        exit 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        say "Node.js is not installed, and this is not a Debian-like system (no apt-get)"
        exit 1
    fi
    started=$SECONDS
    say "installing Debian's nodejs and npm packages ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
    command -v node >/dev/null 2>&1 || { say "the nodejs package installed no node"; exit 1; }
    say "Node.js installed in $((SECONDS - started)) s: $(node --version)"
fi

major="$(node --version | sed -E 's/^v([0-9]+).*/\1/')"
if [[ "$major" -lt 20 ]]; then
    say "warning: Node.js $(node --version) is older than 20, the oldest the clients were run on"
fi

mkdir -p "$cache"
if ! cmp -s "$source_dir/package-lock.json" "$cache/package-lock.json" \
    || [[ ! -d "$cache/node_modules" ]]; then
    started=$SECONDS
    cp "$source_dir/package.json" "$source_dir/package-lock.json" "$cache/"
    say "installing the npm packages of tests/apps/node/package-lock.json into $cache ..."
    (cd "$cache" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    say "installed in $((SECONDS - started)) s"
fi
link="$source_dir/node_modules"
if [[ "$(readlink "$link" 2>/dev/null || true)" != "$cache/node_modules" ]]; then
    rm -rf "$link"
    ln -s "$cache/node_modules" "$link"
fi
