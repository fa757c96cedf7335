# Sandgate. `make run` starts the embedded default; `make test` installs what the tests need
# (idempotently, into .tools/ and test/node/node_modules) and runs every test.
SHELL := /bin/bash
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The one set of build flags: the Dockerfile runs `make build` too, so the image's binary is
# built exactly like this one (static, trimmed, versioned).
GO_BUILD_FLAGS := -trimpath -ldflags "-s -w -X main.version=$(VERSION)"
export CGO_ENABLED := 0
TOOLS := $(CURDIR)/.tools/bin
export PATH := $(TOOLS):$(PATH)

.PHONY: build run test test-go test-policy setup lint bench clean

build:
	go build $(GO_BUILD_FLAGS) -o bin/sandgate ./cmd/sandgate
	@if [ -d examples/mcp-upstream ]; then go build $(GO_BUILD_FLAGS) -o bin/mcp-upstream ./examples/mcp-upstream; fi

run: build
	@mkdir -p var/audit
	./bin/sandgate serve --config examples/sandgate.yaml

setup:
	bash test/setup.sh

test: setup
	$(MAKE) test-policy test-go

test-policy:
	opa test policies/
	go run ./cmd/sandgate policy test policies/

# SANDGATE_REQUIRE_TOOLS makes a test that needs an installed tool fail instead of skip.
test-go:
	SANDGATE_REQUIRE_TOOLS=1 SANDGATE_REQUIRE_KUBE=1 go test -race -timeout 20m ./...

lint:
	gofmt -l . | tee /dev/stderr | (! read)
	go vet ./...

bench:
	go test -run '^$$' -bench . -benchmem ./policy/ ./audit/

clean:
	rm -rf bin var
