#!/usr/bin/env bash
# Make sure Debian's `chromium` is installed, for the viewer's tests in a real headless browser.
#
#   scripts/ensure_chromium.sh
#
# Does nothing when `chromium` is on PATH. Otherwise, as root on a Debian-like system, installs
# the package non-interactively (apt-get update, then install) and prints how long it took. The
# tests never skip when the browser is missing: they fail naming this script.
set -euo pipefail

say() { echo "ensure_chromium.sh: $*" >&2; }

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
    say "chromium is not installed, and only root can install it: sudo apt-get install chromium"
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "chromium is not installed, and this is not a Debian-like system (no apt-get)"
    exit 1
fi
started=$SECONDS
say "installing Debian's chromium package ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null 2>&1 || { say "the chromium package installed no chromium"; exit 1; }
say "chromium installed in $((SECONDS - started)) s: $(chromium --version 2>/dev/null || true)"
