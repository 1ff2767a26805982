#!/bin/sh
# Run a command inside a private network namespace where only the loopback is up.
#
# Ray binds to the machine's external interface even when told 127.0.0.1, so the Ray tests and
# the Ray benchmark run here: nothing they start can reach (or be reached from) any address
# outside 127.0.0.0/8. Needs root, or unprivileged user namespaces (then `unshare -rn`).
# Usage: scripts/in_netns.sh COMMAND [ARGS...]
set -eu
if [ "$(id -u)" = 0 ]; then
	exec unshare -n sh -c 'ip link set lo up && exec "$@"' in_netns "$@"
fi
exec unshare -rn sh -c 'ip link set lo up && exec "$@"' in_netns "$@"
