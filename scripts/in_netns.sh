#!/bin/sh
# Run a command inside a private network namespace where only the loopback is up.
#
# Ray binds to the machine's external interface even when told 127.0.0.1, so the Ray tests and
# the Ray benchmark run here: nothing they start can reach (or be reached from) any address
# outside 127.0.0.0/8. Needs root, or unprivileged user namespaces (then `unshare -rn`).
# Usage: scripts/in_netns.sh COMMAND [ARGS...]
set -eu
if ! command -v ip >/dev/null 2>&1; then
	# A fresh Debian machine may lack iproute2, which brings the loopback up.
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "in_netns.sh: installing Debian's iproute2 (for ip) ..." >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null \
			|| { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null; }
	else
		echo "in_netns.sh: needs ip (Debian's iproute2): sudo apt-get install iproute2" >&2
		exit 1
	fi
fi
if [ "$(id -u)" = 0 ]; then
	exec unshare -n sh -c 'ip link set lo up && exec "$@"' in_netns "$@"
fi
exec unshare -rn sh -c 'ip link set lo up && exec "$@"' in_netns "$@"
