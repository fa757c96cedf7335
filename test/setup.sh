#!/usr/bin/env bash
# Installs everything Sandgate's tests need, idempotently, into a per-machine cache that .tools/
# (ignored by git) links to.
# Safe to run again: each step checks whether its result is already there.
#   apt:  redis-server, etcd-server, curl, iproute2 (netns attack tests), prometheus (for its
#         promtool: the chart's alert rules); squid and tinyproxy (the bench's peers: `make
#         bench` runs offline on what setup installed; their system services are stopped)
#   Go:   opa (policy tests; go.mod's tool directive), helm (chart tests; a tool of
#         test/kube-apiserver's module), staticcheck (make lint), everything-server (MCP
#         conformance upstream), kube-apiserver (built from test/kube-apiserver), agent-sandbox
#         CRDs + controller (pinned v0.5.6 and v1.0.1 from the Go module proxy, zip hash checked, built against
#         Sandgate's Kubernetes versions: test/agent-sandbox/go.mod), cyclonus v0.5.6's
#         evaluator (NetworkPolicy cross-check, built from test/cyclonus), otelcol (an
#         OpenTelemetry Collector built from test/otelcol: the audit export tests and the
#         bench's export variant), smokescreen v0.1.0 (Stripe's egress proxy, a bench peer,
#         from its own module), hydra (Ory Hydra v2.3.0 from test/hydra: the OAuth 2.0 server
#         of the client credentials tests), oidc-op (zitadel/oidc v3.52.0's example OpenID
#         provider from test/oidc-op: the token exchange tests)
#   npm:  node@22, @modelcontextprotocol/conformance, @modelcontextprotocol/server-everything
#         (the TypeScript SDK's reference server: second conformance upstream), @anthropic-ai/sdk,
#         @octokit/openapi (GitHub's REST API description: the GitHub stand-in answers from it)
#         (test/node, versions pinned in its package.json and package-lock.json)
# Cold (empty Go, tool and npm caches) the Go builds are most of the time: opa, kube-apiserver,
# helm and otelcol are built with Sandgate's own dependency versions so the build cache compiles
# their shared packages once, and the builds run side by side. Setup prints the seconds of each
# step and its total; README.md has the measured cold and warm figures.
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

apt_pkgs=(redis-server etcd-server curl iproute2 prometheus squid tinyproxy)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The bench starts its own squid and tinyproxy in the foreground with configs of its own; the
  # packages' services (started by their install where an init system runs) are not used.
  for s in squid tinyproxy; do
    service "$s" stop >/dev/null 2>&1 || true
  done
fi

# These tools are built from their own modules at their own versions, sharing only the standard
# library with the other builds: they keep the default compiler flags (without make test's
# GOFLAGS), as staticcheck's analysis is most of its time in make test.
go_tool() { # name version-marker install-args...
  local name=$1 marker=$2; shift 2
  if [ -x "$bin/$name" ] && [ -f "$bin/.$name.$marker" ]; then return; fi
  log "go install $*"
  GOFLAGS= GOBIN="$bin" go install "$@"
  touch "$bin/.$name.$marker"
}
# The tools that share most of their packages with Sandgate's own tests are built from modules
# whose versions match Sandgate's go.mod: the Go build cache is keyed by package content, flags
# and dependencies, so a package at the same version with the same settings compiles once for a
# tool and the tests. The tests run with CGO_ENABLED=0 (the Makefile exports it); so do these
# builds, or a package using net would compile twice.
export CGO_ENABLED=0

# Under make test and make setup, GOFLAGS (the Makefile's TEST_GOFLAGS) compiles every package
# from outside Sandgate's module unoptimized, the tools' own packages included: the builds below
# inherit it, so a package they share with the tests compiles once, with the same flags (run
# without make, setup builds the tools optimized; they work the same). The tools do little work
# in the tests: the 17 test apiservers of a cold run took 149 s of CPU with the client libraries
# optimized, 156 s with every package but std unoptimized.

# opa: the tool directive in go.mod pins it (the same version Sandgate embeds), and it is built
# with Sandgate's own dependency versions, so its packages are mostly Sandgate's already.
opa_tool() {
  local stamp
  stamp=$(cat "$root/go.mod" "$root/go.sum" | sha256sum | cut -c1-16)
  [ ! -x "$bin/opa" ] || [ "$(cat "$bin/.opa.stamp" 2>/dev/null)" != "$stamp" ] || return 0
  log "building opa from go.mod's tool directive"
  (cd "$root" && go build -o "$bin/.opa.tmp" -ldflags "-s -w" github.com/open-policy-agent/opa)
  mv -f "$bin/.opa.tmp" "$bin/opa"
  rm -f "$bin"/.opa.v* # the marker of opa installed from its own module, before this
  echo "$stamp" > "$bin/.opa.stamp"
}

# promtool checks the chart's PrometheusRule (test/deploy). Debian's prometheus package carries
# it; building it from the prometheus module took 26 minutes cold on a busy 2-core machine.
# Its own path, not `command -v`: with .tools/bin first on PATH (make test puts it there), that
# finds this very link and a second run made it point at itself.
ln -sf /usr/bin/promtool "$bin/promtool"

# kube-apiserver and helm: test/kube-apiserver's module requires every dependency it shares with
# Sandgate at Sandgate's version (k8s.io/api, apimachinery, client-go, grpc, protobuf, otel, x/*),
# so the biggest shared packages compile once; helm is a tool of that module (its go.mod pins
# v3.22.0), built after the apiserver so its Kubernetes packages are already compiled.
kube_apiserver() {
  [ -d "$root/test/kube-apiserver" ] || return 0
  local stamp
  stamp=$(cat "$root/test/kube-apiserver/go.mod" "$root/test/kube-apiserver/main.go" | sha256sum | cut -c1-16)
  if [ ! -x "$bin/kube-apiserver" ] || [ "$(cat "$bin/.kube-apiserver.stamp" 2>/dev/null)" != "$stamp" ]; then
    log "building kube-apiserver v1.37.2 (a few minutes when cold)"
    # Build beside the target and rename: an interrupted build never leaves a broken binary.
    (cd "$root/test/kube-apiserver" && go build -o "$bin/.kube-apiserver.tmp" \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37" .)
    mv -f "$bin/.kube-apiserver.tmp" "$bin/kube-apiserver"
    echo "$stamp" > "$bin/.kube-apiserver.stamp"
  fi
}

helm_tool() {
  [ -d "$root/test/kube-apiserver" ] || return 0
  local stamp
  stamp=$(cat "$root/test/kube-apiserver/go.mod" | sha256sum | cut -c1-16)
  [ ! -x "$bin/helm" ] || [ "$(cat "$bin/.helm.stamp" 2>/dev/null)" != "$stamp" ] || return 0
  log "building helm from test/kube-apiserver's tool directive"
  (cd "$root/test/kube-apiserver" && go build -o "$bin/.helm.tmp" -ldflags "-s -w" helm.sh/helm/v3/cmd/helm)
  mv -f "$bin/.helm.tmp" "$bin/helm"
  rm -f "$bin"/.helm.v*
  echo "$stamp" > "$bin/.helm.stamp"
}

# The OpenTelemetry Collector of the audit export tests (test/otelcoltest runs it): its own module
# under test/otelcol, every collector module on one release line (v0.161.0 / v1.67.0), what it
# shares with Sandgate (grpc, otel, protobuf, x/*, client-go) at Sandgate's versions, stamped by
# that module's files like the kube-apiserver.
otel_collector() {
  [ -d "$root/test/otelcol" ] || return 0
  local stamp
  stamp=$(cat "$root/test/otelcol/go.mod" "$root/test/otelcol/go.sum" "$root/test/otelcol/main.go" | sha256sum | cut -c1-16)
  if [ ! -x "$bin/otelcol" ] || [ "$(cat "$bin/.otelcol.stamp" 2>/dev/null)" != "$stamp" ]; then
    log "building otelcol v0.161.0 from test/otelcol (a few minutes when cold)"
    (cd "$root/test/otelcol" && go build -o "$bin/.otelcol.tmp" -ldflags "-s -w" .)
    mv -f "$bin/.otelcol.tmp" "$bin/otelcol"
    echo "$stamp" > "$bin/.otelcol.stamp"
  fi
}

# The identity providers of the minted-credential tests (docs/credentials.md), each from a module
# of its own pinned by its go.sum and stamped by its files like the collector: Ory Hydra v2.3.0
# (test/hydra's tool; its in-memory database is SQLite, which needs cgo and the sqlite tag) and
# zitadel/oidc's example OpenID provider with run-token exchange (test/oidc-op).
hydra_tool() {
  [ -d "$root/test/hydra" ] || return 0
  local stamp
  stamp=$(cat "$root/test/hydra/go.mod" "$root/test/hydra/go.sum" | sha256sum | cut -c1-16)
  [ ! -x "$bin/hydra" ] || [ "$(cat "$bin/.hydra.stamp" 2>/dev/null)" != "$stamp" ] || return 0
  log "building hydra v2.3.0 from test/hydra (a few minutes when cold)"
  (cd "$root/test/hydra" && CGO_ENABLED=1 go build -tags sqlite -o "$bin/.hydra.tmp" -ldflags "-s -w" github.com/ory/hydra/v2)
  mv -f "$bin/.hydra.tmp" "$bin/hydra"
  echo "$stamp" > "$bin/.hydra.stamp"
}
oidc_op() {
  [ -d "$root/test/oidc-op" ] || return 0
  local stamp
  stamp=$(cat "$root/test/oidc-op/go.mod" "$root/test/oidc-op/go.sum" "$root/test/oidc-op/main.go" | sha256sum | cut -c1-16)
  [ ! -x "$bin/oidc-op" ] || [ "$(cat "$bin/.oidc-op.stamp" 2>/dev/null)" != "$stamp" ] || return 0
  log "building zitadel/oidc v3.52.0's example OP from test/oidc-op"
  (cd "$root/test/oidc-op" && go build -o "$bin/.oidc-op.tmp" -ldflags "-s -w" .)
  mv -f "$bin/.oidc-op.tmp" "$bin/oidc-op"
  echo "$stamp" > "$bin/.oidc-op.stamp"
}

idp_tools() { hydra_tool && oidc_op; }

# module_zip MODULE VERSION SHA256 H1: downloads MODULE@VERSION from the Go module proxy, checks
# its zip against the sha256 and module hash pinned below, and prints the zip's path.
module_zip() {
  local info zip sum
  info=$(cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod GOSUMDB=off go mod download -json "$1@$2")
  zip=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Zip": "\(.*\)",\{0,1\}$/\1/p')
  sum=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p')
  echo "$3  $zip" | sha256sum -c --quiet - >&2 || { log "$1@$2: zip sha256 is not $3"; return 1; }
  [ "$sum" = "$4" ] || { log "$1@$2: module hash $sum, want $4"; return 1; }
  printf '%s\n' "$zip"
}

# Agent Sandbox (kubernetes-sigs/agent-sandbox): the real CRDs and controller for the kube
# tests, of every supported release (test/kubetest's Releases): v0.5.6 and v1.0.1 (GA). Each
# release comes from the Go module proxy, pinned, and its zip is checked against the hashes below
# (the module hashes are sum.golang.org's) before anything in it is used; the CRDs are copied to
# .tools/<folder>/crds (test/kubetest installs them) and the controller is built to .tools/bin.
# The controller is built from that source against Sandgate's Kubernetes versions: its own go.mod
# pins k8s.io/* v0.36.x and controller-runtime v0.24.1, which compiled a third copy of the
# Kubernetes client libraries on a cold machine (its step: 20 of the 42 minutes of a cold setup,
# side by side with the others). test/agent-sandbox/go.mod (and go.sum, which pins every module)
# replaces the release's: k8s.io/* v0.37.2 as Sandgate and the test apiserver, controller-runtime
# v0.25.2, otel, grpc and x/* at Sandgate's versions. Both releases require the same modules, so
# one go.mod serves both; every kube test passed with it.
# agent_sandbox VERSION ZIP-SHA256 H1 FOLDER BINARY
agent_sandbox() {
  local version=$1 zip_sha256=$2 h1=$3 folder=$4 binary=$5 mods stamp zip src
  mods=$(cat "$root/test/agent-sandbox/go.mod" "$root/test/agent-sandbox/go.sum" | sha256sum | cut -c1-16)
  stamp="$version-${zip_sha256:0:16}-$mods"
  [ ! -x "$bin/$binary" ] || [ "$(cat "$tools/$folder/.stamp" 2>/dev/null)" != "$stamp" ] || return 0
  log "agent-sandbox $version: download, check, copy CRDs, build the controller"
  zip=$(module_zip sigs.k8s.io/agent-sandbox "$version" "$zip_sha256" "$h1")
  rm -rf "$tools/$folder.tmp" && mkdir -p "$tools/$folder.tmp/crds"
  # From the checked zip itself, not the extracted folder, so what is installed is what was hashed.
  unzip -q -j "$zip" "sigs.k8s.io/agent-sandbox@$version/k8s/crds/*.yaml" -d "$tools/$folder.tmp/crds"
  unzip -q "$zip" -d "$tools/$folder.tmp/src"
  src="$tools/$folder.tmp/src/sigs.k8s.io/agent-sandbox@$version"
  chmod -R u+w "$src"
  cp "$root/test/agent-sandbox/go.mod" "$root/test/agent-sandbox/go.sum" "$src/"
  (cd "$src" && GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" GOSUMDB=off go build -o "$bin/.$binary.tmp" ./cmd/agent-sandbox-controller)
  mv -f "$bin/.$binary.tmp" "$bin/$binary"
  rm -rf "$tools/$folder.tmp/src" "$tools/$folder"
  mv "$tools/$folder.tmp" "$tools/$folder"
  echo "$stamp" > "$tools/$folder/.stamp"
}
agent_sandboxes() {
  agent_sandbox v0.5.6 741cb91279958a3591a4e9509820931f3de84ca454f3c20cff06b631fbc506a8 \
    'h1:+lIxbO5MIPYqmnbv4eWZDm+bh9Y6qHvZ+qXEe4MJVkU=' agent-sandbox agent-sandbox-controller
  agent_sandbox v1.0.1 8548f51a6691fb6292f56da98fcc2daacc20b90b5f279d50771313eee6fe747d \
    'h1:AZA1kFurdKIdNL04j9RhGZXb3kL2/O80eiXaTC/oXjM=' agent-sandbox-v1.0.1 agent-sandbox-controller-v1.0.1
}

# cyclonus: an independent NetworkPolicy evaluator, to cross-check internal/kube/netpoleval cell
# by cell. test/cyclonus is a small command around cyclonus's matcher (the evaluator its analyze
# command runs) in its own module: its go.sum pins github.com/mattfenwick/cyclonus v0.5.6's
# module hash, and it builds against Sandgate's Kubernetes versions. The release's own command
# (k8s.io/* v0.30.2) compiled a third copy of the Kubernetes client libraries: 15 of the 42
# minutes of a cold setup, side by side with the others; this build takes seconds once the
# apiserver's packages are compiled.
cyclonus() {
  [ -d "$root/test/cyclonus" ] || return 0
  local stamp
  stamp=$(cat "$root/test/cyclonus/go.mod" "$root/test/cyclonus/go.sum" "$root/test/cyclonus/main.go" | sha256sum | cut -c1-16)
  [ ! -x "$bin/cyclonus" ] || [ "$(cat "$bin/.cyclonus.stamp" 2>/dev/null)" != "$stamp" ] || return 0
  log "building cyclonus v0.5.6's evaluator from test/cyclonus"
  (cd "$root/test/cyclonus" && go build -o "$bin/.cyclonus.tmp" -ldflags "-s -w" .)
  mv -f "$bin/.cyclonus.tmp" "$bin/cyclonus"
  rm -f "$bin"/.cyclonus.v* # the marker of the release's command, installed before this
  echo "$stamp" > "$bin/.cyclonus.stamp"
}

node_packages() {
  [ -f "$root/test/node/package.json" ] || return 0
  local stamp
  stamp=$(sha256sum "$root/test/node/package.json" "$root/test/node/package-lock.json" 2>/dev/null | sha256sum | cut -c1-16)
  # The stamp lives in the clone's own node_modules: the tools cache is shared by every clone
  # on the machine, and one clone's install says nothing of another's.
  if [ "$(cat "$root/test/node/node_modules/.sandgate-stamp" 2>/dev/null)" != "$stamp" ]; then
    log "npm ci (test/node)"
    (cd "$root/test/node" && { [ -f package-lock.json ] && npm ci --no-audit --no-fund --loglevel=error || npm install --no-audit --no-fund --loglevel=error; })
    echo "$stamp" > "$root/test/node/node_modules/.sandgate-stamp"
  fi
}

# With SANDGATE_SETUP_WARM=1 (make test sets it) setup also compiles what the test phase will
# need, in setup's idle gaps instead of after it: `go vet ./...` compiles every package the tests
# import (and its result is cached, so lint's go vet only reads it), and the race build of audit
# and proxy. A finding is lint's and the tests' to report, with its output; here only the
# compiling matters.
warm_tests() {
  [ "${SANDGATE_SETUP_WARM:-0}" = 1 ] || return 0
  (cd "$root" && go vet ./... >/dev/null 2>&1) || true
}
warm_race() {
  [ "${SANDGATE_SETUP_WARM:-0}" = 1 ] || return 0
  # go build of non-main packages compiles them into the build cache and links nothing (a
  # test binary's link is not cached: linking one here was thrown away). The few test-only
  # packages (testify, httptest) compile in the test phase.
  # The flags are the Makefile's test-race flags (RACE_GCFLAGS: unoptimized), or nothing built
  # here would be reused.
  (cd "$root" && CGO_ENABLED=1 go build -race -gcflags='all=-N -l' ./audit/ ./proxy/ ./internal/limits/ >/dev/null 2>&1) || true
}

# Every module the builds below need, fetched while they compile: downloads are network time,
# which overlaps compiling where fetching on first use would stall a build.
download_modules() {
  local d
  for d in "$root" "$root/test/kube-apiserver" "$root/test/otelcol" "$root/test/cyclonus" "$root/test/hydra" "$root/test/oidc-op"; do
    [ -f "$d/go.mod" ] && (cd "$d" && go mod download) &
  done
  wait
}

jobs_dir=$(mktemp -d)
trap 'rm -rf "$jobs_dir"' EXIT
# timed STEP command...: runs the command and records how long it took, for the summary below
# (and CI's logs) to say where setup's time goes.
timed() {
  local step=$1 start=$SECONDS
  shift
  "$@"
  echo "$step $((SECONDS - start))" >> "$jobs_dir/times"
}
# The builds sharing Sandgate's dependency versions run one after another, in this order, so
# each shared package compiles once (two go commands compiling the same package at the same
# time both compile it); opa first, as it shares the most with the tests; the Agent Sandbox
# controller and cyclonus after the apiserver, whose Kubernetes packages they share.
# staticcheck and the conformance server are built from their own modules, so they share only
# the standard library with the rest: they start once opa's build has compiled it, beside the
# apiserver's. Started with the others they compiled it a second and third time (measured,
# cold, alone: staticcheck 130 s of CPU on an empty build cache, 70 s once the standard library
# is in it; the conformance server about 50 s less); the whole run is CPU-bound on 2 cores.
shared_builds() {
  timed opa opa_tool
  side_job staticcheck timed staticcheck go_tool staticcheck v0.8.2 honnef.co/go/tools/cmd/staticcheck@v0.8.2
  side_job everything-server timed everything-server go_tool everything-server v1.8.0 github.com/modelcontextprotocol/go-sdk/conformance/everything-server@v1.8.0
  # The bench's Go peer (bench/smokescreen.go names the version), from its own module.
  side_job smokescreen timed smokescreen go_tool smokescreen v0.1.0 github.com/stripe/smokescreen@v0.1.0
  side_job idps timed idps idp_tools
  timed kube-apiserver kube_apiserver
  timed agent-sandbox agent_sandboxes
  timed cyclonus cyclonus
  if [ "${SANDGATE_SETUP_HELM:-1}" = 1 ]; then timed helm helm_tool; fi
  timed otelcol otel_collector
  timed warm-tests warm_tests
  local name failed=0
  for name in "${!side_pids[@]}"; do
    wait "${side_pids[$name]}" || { echo "$name failed (its log is printed with the others)"; failed=1; }
  done
  return $failed
}
# side_job NAME command...: a job that shared_builds starts part-way; its output goes to its own
# log like run_job's, and shared_builds fails if it does.
declare -A side_pids=()
side_job() {
  local name=$1; shift
  ( set -euo pipefail; "$@" ) >"$jobs_dir/$name.log" 2>&1 &
  side_pids[$name]=$!
}

# The jobs run side by side: one go build keeps 2 cores busy only part of the time (links, long
# dependency chains, downloads), and the independent builds fill the gaps. Each job's output goes
# to its own log, printed at the end.
declare -A job_pids=()
run_job() { # name command...
  local name=$1; shift
  ( set -euo pipefail; "$@" ) >"$jobs_dir/$name.log" 2>&1 &
  job_pids[$name]=$!
}
setup_start=$SECONDS
run_job download timed download download_modules
run_job shared shared_builds
run_job node timed npm node_packages
run_job warm-race timed warm-race warm_race
failed=()
for name in "${!job_pids[@]}"; do
  if ! wait "${job_pids[$name]}"; then failed+=("$name"); fi
done
for f in "$jobs_dir"/*.log; do [ -s "$f" ] && sed "s/^/  /" "$f" >&2; done
if [ ${#failed[@]} -gt 0 ]; then
  log "failed: ${failed[*]} (output above)"
  exit 1
fi
log "seconds per step: $(sort -k2,2nr "$jobs_dir/times" 2>/dev/null | tr ' \n' '= ' || true)"
log "ready in $((SECONDS - setup_start))s: $(ls "$bin" | tr '\n' ' ')"
