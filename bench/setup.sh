#!/usr/bin/env bash
# Installs the bench's peer proxies (Squid, tinyproxy) from Debian packages, only when missing.
# Idempotent; CI does not run the bench, so this is not part of test/setup.sh. The bench starts
# its own instances in the foreground with generated configs: the packages' services are never used.
set -euo pipefail
missing=()
command -v squid >/dev/null 2>&1 || missing+=(squid)
command -v tinyproxy >/dev/null 2>&1 || missing+=(tinyproxy)
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "bench/setup.sh: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The packages may start their system services; the bench needs neither.
for s in squid tinyproxy; do
	$SUDO service "$s" stop >/dev/null 2>&1 || true
done
