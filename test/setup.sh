#!/usr/bin/env bash
# Installs everything Sandgate's tests need, idempotently, into a per-machine cache that .tools/
# (ignored by git) links to.
# Safe to run again: each step checks whether its result is already there.
#   apt:  redis-server, etcd-server, curl, iproute2 (netns attack tests)
#   Go:   opa (policy tests), helm (chart tests), staticcheck (make lint), everything-server (MCP
#         conformance upstream),
#         kube-apiserver (built from test/kube-apiserver)
#   npm:  node@22, @modelcontextprotocol/conformance, @anthropic-ai/sdk (test/node)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The built tools live in a cache outside the clone, once per machine, and .tools in the clone
# links to it: a fresh clone (CI's) reuses them. Each tool carries its own version stamp below;
# the cache's name changes only if its layout does.
cache=${SANDGATE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandgate/tools-v1}
mkdir -p "$cache/bin"
if [ -d "$root/.tools" ] && [ ! -L "$root/.tools" ]; then
  # A .tools folder from before the cache: keep what it built.
  cp -an "$root/.tools/." "$cache/" && mv "$root/.tools" "$root/.tools.old" && rm -rf "$root/.tools.old"
fi
[ -L "$root/.tools" ] || ln -s "$cache" "$root/.tools"
tools="$root/.tools"
bin="$tools/bin"
log() { printf 'setup: %s\n' "$*" >&2; }

apt_pkgs=(redis-server etcd-server curl iproute2)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

go_tool() { # name version-marker install-args...
  local name=$1 marker=$2; shift 2
  if [ -x "$bin/$name" ] && [ -f "$bin/.$name.$marker" ]; then return; fi
  log "go install $*"
  GOBIN="$bin" go install "$@"
  touch "$bin/.$name.$marker"
}
go_tool opa v1.22.3 github.com/open-policy-agent/opa@v1.22.3
go_tool staticcheck v0.8.2 honnef.co/go/tools/cmd/staticcheck@v0.8.2
go_tool everything-server v1.8.0 github.com/modelcontextprotocol/go-sdk/conformance/everything-server@v1.8.0
if [ "${SANDGATE_SETUP_HELM:-1}" = 1 ]; then
  go_tool helm v3.22.0 helm.sh/helm/v3/cmd/helm@v3.22.0
fi

if [ -d "$root/test/kube-apiserver" ]; then
  stamp=$(cat "$root/test/kube-apiserver/go.mod" "$root/test/kube-apiserver/main.go" | sha256sum | cut -c1-16)
  if [ ! -x "$bin/kube-apiserver" ] || [ "$(cat "$bin/.kube-apiserver.stamp" 2>/dev/null)" != "$stamp" ]; then
    log "building kube-apiserver v1.37.2 (a few minutes when cold)"
    # Build beside the target and rename: an interrupted build never leaves a broken binary.
    (cd "$root/test/kube-apiserver" && go build -o "$bin/.kube-apiserver.tmp" \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37" .)
    mv -f "$bin/.kube-apiserver.tmp" "$bin/kube-apiserver"
    echo "$stamp" > "$bin/.kube-apiserver.stamp"
  fi
fi

if [ -f "$root/test/node/package.json" ]; then
  stamp=$(sha256sum "$root/test/node/package.json" "$root/test/node/package-lock.json" 2>/dev/null | sha256sum | cut -c1-16)
  if [ ! -d "$root/test/node/node_modules" ] || [ "$(cat "$tools/.npm.stamp" 2>/dev/null)" != "$stamp" ]; then
    log "npm ci (test/node)"
    (cd "$root/test/node" && { [ -f package-lock.json ] && npm ci --no-audit --no-fund --loglevel=error || npm install --no-audit --no-fund --loglevel=error; })
    echo "$stamp" > "$tools/.npm.stamp"
  fi
fi
log "ready: $(ls "$bin" | tr '\n' ' ')"
