// Package redisconn opens the Redis client that the shared-state pieces (limits, grants, MCP
// sessions, the audit stream mirror) use, from the config's redis section, with every call
// bounded in time: a request-path call runs under a context deadline of redis.op_timeout that
// go-redis applies to the dial, the handshake and the wait for a pooled connection too, and
// Guard, a circuit breaker in front of the client, skips Redis for redis.breaker.open_for once it
// failed. So a Redis that is gone or hangs delays the first request by about op_timeout and the
// next ones not at all.
package redisconn
