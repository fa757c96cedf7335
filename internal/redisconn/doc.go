// Package redisconn opens the Redis client that the shared-state pieces (limits, grants, the audit
// stream mirror) use, from the config's redis section, with every call bounded in time: a Redis
// that is gone or hangs delays a request by about redis.op_timeout, never more.
package redisconn
