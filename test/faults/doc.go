// Package faults is Sandgate's fault suite: the sandgate binary, real redis-server processes and
// a real MCP upstream on loopback, with faults injected (Redis stopped with SIGSTOP or killed,
// SIGTERM under a slow tool, an upstream down, an upstream answering one sandbox with errors).
// Every scenario checks that the audit log holds exactly one event per answered request.
// The tests are in the _test.go files; `go test ./test/faults/` runs them (and `make test`).
package faults
