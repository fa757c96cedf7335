# Sandgate. `make run` starts the embedded default; `make test` installs what the tests need
# (idempotently, into .tools/ and test/node/node_modules) and runs every test. Tests write only
# into temporary folders and the tools cache: var/ and bin/ are yours (`make run`, `make build`).
SHELL := /bin/bash
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The one set of build flags: the Dockerfile runs `make build` too, so the image's binary is
# built exactly like this one (static: CGO_ENABLED=0; stripped; versioned).
GO_BUILD_FLAGS := -ldflags "-s -w -X main.version=$(VERSION)"
export CGO_ENABLED := 0
TOOLS := $(CURDIR)/.tools/bin
export PATH := $(TOOLS):$(PATH)

.PHONY: build run test test-go test-unit test-race test-policy setup lint fuzz bench bench-go bench-policy clean image tools-env print-test-goflags

# The commands make build writes to bin/. A first build compiles about 1,200 packages, minutes on
# 2 cores: go build -v names each package as it compiles it, and the build counts them against
# the packages go list finds stale, a line per tenth, then says it links (the binaries take the
# last half minute or more); a warm build prints only its last line.
BUILD_CMDS := ./cmd/sandgate ./examples/mcp-upstream ./examples/model-api
build:
	@set -o pipefail; start=$$SECONDS; \
	n=$$(go list -deps -f '{{if .Stale}}stale{{end}}' $(BUILD_CMDS) | grep -c stale); \
	[ "$$n" -lt 20 ] || echo "make build: compiling $$n packages for bin/sandgate, bin/mcp-upstream and bin/model-api (a first build takes minutes)"; \
	go build -v $(GO_BUILD_FLAGS) -o bin/ $(BUILD_CMDS) 2>&1 | { done=0 shown=0; while IFS= read -r line; do \
		if [[ ! $$line =~ ^[[:alnum:]._/~-]+$$ ]]; then printf '%s\n' "$$line"; continue; fi; \
		done=$$((done + 1)); tenth=$$((done * 10 / (n > 0 ? n : 1))); [ "$$n" -ge 20 ] || continue; \
		if [ "$$done" -ge "$$n" ]; then echo "  100%  compiled; linking the three binaries"; \
		elif [ "$$tenth" -gt "$$shown" ]; then shown=$$tenth; echo "  $$((tenth * 10))%  $$done of $$n packages"; fi; \
	done; } && echo "make build: bin/sandgate, bin/mcp-upstream and bin/model-api ($$((SECONDS - start)) s)"

# Beside serve runs bin/model-api, a stand-in for the Anthropic API that examples/sandgate.yaml
# dials for api.anthropic.com:443 (proxy.connect_to), so the egress tour answers offline; it
# stops with serve. SSL_CERT_FILE adds its CA to what serve trusts upstream (Go still reads the
# system's certificate folders). MODEL_API must match the config's connect_to address.
MODEL_API ?= 127.0.0.1:8443
# examples/run.sh starts both; Sandgate logs one "ready: …" line when it is.
run: build var/ca/ca.crt var/secrets/anthropic var/audit-keys/chain.key var/model-api/ca.crt
	@bash examples/run.sh $(MODEL_API)

var/ca/ca.crt:
	./bin/sandgate ca init --dir var/ca

# The audit log's chain key and checkpoint signing key (docs/audit.md): made once, kept, as the
# CA is. Removing them makes the next log unverifiable with the old ones (rotation: docs/audit.md).
var/audit-keys/chain.key:
	./bin/sandgate audit keygen --dir var/audit-keys

var/model-api/ca.crt:
	./bin/model-api -init -dir var/model-api

# The example's model-API key, which Sandgate injects: $ANTHROPIC_API_KEY, else a placeholder. The
# stand-in accepts exactly this key; the real API (connect_to removed) needs a real one.
var/secrets/anthropic:
	@mkdir -p -m 700 var/secrets
	@umask 077; printf '%s' "$${ANTHROPIC_API_KEY:-sk-ant-placeholder-not-a-real-key}" > $@

setup:
	bash test/setup.sh

# The tools `make setup` installs (opa, helm, promtool, …) live in .tools/bin, which only make's
# own commands have on PATH. For a shell of yours: eval "$$(make -s tools-env)".
tools-env:
	@echo 'export PATH="$(TOOLS):$$PATH"'

# make test compiles every package from outside this module unoptimized (-N -l): the standard
# library and Sandgate's own packages keep the default flags (std= and github.com/sandgate/
# sandgate/...= give them back), so what is tested is Sandgate's code as `make build` compiles it,
# calling its dependencies' code unoptimized. A cold machine is CPU-bound compiling (2 cores),
# and the compiler's optimising passes are a fifth of that: the tests' 1047 dependency packages
# took 640 s of CPU to compile, 463 and 506 s so in two runs (`go build` of them on an empty
# build cache with the standard library compiled; one run of the default flags). GOFLAGS
# carries the flags so that every go command of the run compiles a package alike and once: go
# test, go vet, staticcheck's go list -export, the tests that build a binary, and the tools
# test/setup.sh builds from modules that share packages with the tests (opa, kube-apiserver,
# helm, the Collector, the Agent Sandbox controller).
# `make build`, `make bench` and the image keep the default flags throughout.
# And every binary of the run links without DWARF (-ldflags=-w, where a command gives no
# -ldflags of its own): nothing here reads it (stack traces, race reports and profiles use the
# symbol table), and a link without it takes about a third less CPU (cmd/sandgate's test
# binary: 12.3 → 7.7 s), for some fifty test binaries and the binaries tests build.
TEST_GOFLAGS := '-gcflags=all=-N -l' -gcflags=std= -gcflags=github.com/sandgate/sandgate/...= -ldflags=-w
setup test test-go test-unit test-race test-policy lint print-test-goflags: export GOFLAGS := $(strip $(subst $(TEST_GOFLAGS),,$(GOFLAGS)) $(TEST_GOFLAGS))

# The GOFLAGS make test's commands run with (test/layout checks them).
print-test-goflags:
	@echo "$$GOFLAGS"

# SANDGATE_SETUP_WARM: setup also compiles the tests' packages in its idle gaps (test/setup.sh).
# Then the checks run two at a time, the long go test ./... first: much of its time is tests
# waiting on the servers they start, which lint, the policy tests and the race run fill. Each
# target's output is printed whole when it ends (--output-sync), so logs do not interleave.
test:
	SANDGATE_SETUP_WARM=1 bash test/setup.sh
	$(MAKE) -j2 --output-sync=target test-unit lint test-policy test-race

test-policy:
	opa test policies/
	go run ./cmd/sandgate policy test policies/

test-go: test-unit test-race

# go test's own vet pass (-vet=off here) is a subset of `make lint`'s go vet ./..., which
# make test runs too; kept on, each go test computed vet facts for every dependency again, its
# analyzer set and the race build each under their own cache key (a cold race build: 749 vet
# actions, 69 of its 361 s of action time).
TEST_FLAGS := -vet=off

# SANDGATE_REQUIRE_TOOLS makes a test that needs an installed tool fail instead of skip.
# -p 4 (go test's default is one package per core): the long packages spend much of their time
# waiting on the servers they start (apiservers, Redis, Collectors, serve), which a third and
# fourth package fill.
test-unit:
	SANDGATE_REQUIRE_TOOLS=1 SANDGATE_REQUIRE_KUBE=1 SANDGATE_CONFORMANCE=1 go test -p 4 $(TEST_FLAGS) -timeout 20m ./...

# The race build compiles unoptimized (-N -l): it shares no package with any other build (every
# package, the standard library's included, compiles again with -race), the race detector
# instruments unoptimized code as well, and compiling it so takes less CPU on a cold machine.
# test/setup.sh's race warm-up uses the same flags, or its work would not be reused.
RACE_GCFLAGS := -gcflags=all=-N\ -l

# The race detector needs cgo; it runs on the packages whose concurrency is their contract
# (the audit sequencer; the proxy's tunnels, cleaned up by whichever goroutine closes them; the
# limiter's per-minute cache of its callers' counter keys).
# It compiles every dependency of theirs again with -race: neither imports client-go
# (test/layout's TestRequestPathDoesNotImportClientGo keeps it so).
test-race:
	CGO_ENABLED=1 go test -race $(RACE_GCFLAGS) $(TEST_FLAGS) -timeout 10m ./audit/ ./proxy/ ./internal/limits/

# gofmt, go vet and staticcheck (installed by test/setup.sh): zero findings, deprecated calls
# included. Part of `make test`.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: not formatted:"; echo "$$out"; exit 1; fi
	go vet ./...
	staticcheck ./...

# Every fuzz target for FUZZTIME each (default 10s; about 4 minutes for all). Not part of
# `make test`: a fuzzing run does not repeat. Run it after changing a parser or what it refuses.
FUZZTIME ?= 10s
fuzz:
	FUZZTIME=$(FUZZTIME) bash test/fuzz.sh

# The load benchmark (bench/): N simulated sandboxes against Sandgate (the real binary, a
# separate process), direct, bare Go floors (CONNECT relay, reverse proxy, goproxy's
# interception, an mcp-go gateway) and the peers make setup installs (Squid, tinyproxy,
# Smokescreen), interleaved. It installs nothing and needs no network: a peer that is not
# installed is skipped, and the run says which and why. The report goes to var/bench/ (ignored
# by git); BENCH_FLAGS=-publish writes it into bench/results/ instead. bench/README.md has the
# run times: about 25 minutes, BENCH_FLAGS=-quick about 7. Route and mcp also run against
# Sandgate with the decision log on and with a shadow policy (-policy-variants), with async
# audit delivery (-delivery-variants) and with the audit log exported over OTLP to a Collector
# (-export-variants, skipped without .tools/bin/otelcol), and route with its credential minted
# per sandbox run (-credential-variants); then the scale-out cells
# (-replicas: 3 replicas on one Redis and on a Cluster against one with memory state, written
# next to the report as LABEL-replicas.md).
BENCH_FLAGS ?=
BENCH_REPLICAS_FLAGS ?=
bench: build
	go build -o bin/bench-relay ./bench/cmd/relay
	go build -o bin/sandbench ./bench/cmd/sandbench
	./bin/sandbench -policy-variants -delivery-variants -export-variants -credential-variants $(BENCH_FLAGS)
	./bin/sandbench -replicas -concurrency 64 $(filter -quick -publish,$(BENCH_FLAGS)) $(BENCH_REPLICAS_FLAGS)

# The Go micro-benchmarks (policy decision, audit writer, proxy and gateway request paths).
bench-go:
	go test -run '^$$' -bench . -benchmem ./policy/ ./audit/ ./proxy/ ./gateway/

clean:
	rm -rf bin var

# Builds the container image where a container engine runs (none does on the CI machines).
IMAGE ?= sandgate:$(VERSION)
image:
	@command -v docker >/dev/null && docker info >/dev/null 2>&1 || { echo "make image: no container engine here (docker info failed)"; exit 1; }
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

# The chart ships a copy of policies/ (Helm cannot read outside the chart); test/deploy fails
# when the copy differs.
.PHONY: chart-sync print-build-flags
chart-sync:
	rm -f charts/sandgate/policies/*.rego charts/sandgate/policies/*.yaml charts/sandgate/policies/*.json
	cp policies/*.rego charts/sandgate/policies/
	cp $(wildcard policies/*.yaml policies/*.json) charts/sandgate/policies/

# The build's environment and flags, for tests that build the binary exactly like `make build`:
# line 1 CGO_ENABLED=…, line 2 the go build flags (shell-quoted).
print-build-flags:
	@echo 'CGO_ENABLED=$(CGO_ENABLED)'
	@echo '$(GO_BUILD_FLAGS)'

# Issue #23's policy target: a first-seen decision on the shipped policies against OPA's own
# evaluation of a one-line policy, interleaved in one run (policy/firstseen_bench_test.go);
# prints each case's median x-floor over the repetitions (target ≤ 1.5).
BENCH_POLICY_COUNT ?= 5
bench-policy:
	go test -run '^$$' -bench 'FirstSeenVsFloor' -benchmem -count $(BENCH_POLICY_COUNT) ./policy/ | tee /dev/stderr | \
	awk '/x-floor/ { for (i = 1; i < NF; i++) if ($$(i+1) ~ /x-floor$$/) r[$$1 " " $$(i+1)] = r[$$1 " " $$(i+1)] " " $$i } \
	END { for (k in r) { n = split(substr(r[k], 2), v, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t } \
	m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2; printf "%s median %.2f (min %.2f, max %.2f, n=%d)\n", k, m, v[1], v[n], n } }'
