#!/usr/bin/env bash
# Installs the bench's peer proxies, only when missing: Squid and tinyproxy from Debian packages,
# and Stripe's Smokescreen (a Go egress proxy with ACLs) built from its own module on the Go
# module proxy into the tools cache that .tools links to (test/setup.sh makes the link), never
# into Sandgate's go.mod. Idempotent; CI does not run the bench, so this is not part of
# test/setup.sh. The bench starts its own instances in the foreground with generated configs:
# the packages' services are never used.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${SANDGATE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandgate/tools-v1}
mkdir -p "$cache/bin"
[ -e "$root/.tools" ] || ln -s "$cache" "$root/.tools"
smokescreen_version=v0.1.0
if [ ! -x "$root/.tools/bin/smokescreen" ] || [ ! -f "$root/.tools/bin/.smokescreen.$smokescreen_version" ]; then
	echo "bench/setup.sh: go install github.com/stripe/smokescreen@$smokescreen_version"
	# go install pkg@version builds from the module's own go.mod, outside this module.
	(cd "${TMPDIR:-/tmp}" && GOBIN="$root/.tools/bin" go install "github.com/stripe/smokescreen@$smokescreen_version")
	touch "$root/.tools/bin/.smokescreen.$smokescreen_version"
fi
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
