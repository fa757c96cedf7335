package limits

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/internal/config"
)

// NewRedis returns a Limiter whose counters live in Redis under prefix (config redis.key_prefix),
// shared by every replica using the same Redis and prefix. All keys carry the hash tag {limits}
// so each script's keys sit in one slot of a Redis Cluster.
//
// The client's own timeouts should not be longer than WithTimeout's, and the client should have
// ContextTimeoutEnabled so the deadline also bounds a hung connection.
func NewRedis(client redis.UniversalClient, prefix string, cfg config.Limits, opts ...Option) *Limiter {
	return newLimiter(&redisStore{client: client}, prefix, cfg, opts)
}

// Each script gets three keys per scope (requests counter, tokens counter, lease set) and ARGV:
// now (ms), rpm TTL (ms), tokens TTL (ms), an operation argument, a lease ID, then three limits
// per scope. It returns the code (10*scope + limit, 0 when allowed) and three counts per scope.
const luaPrelude = `
local now = tonumber(ARGV[1])
local n = #KEYS / 3
local rs, ts, cs = {}, {}, {}
local function lim(i, j) return tonumber(ARGV[5 + 3*(i-1) + j]) end
local function read(i)
  rs[i] = tonumber(redis.call('GET', KEYS[3*i-2]) or '0')
  ts[i] = tonumber(redis.call('GET', KEYS[3*i-1]) or '0')
  redis.call('ZREMRANGEBYSCORE', KEYS[3*i], '-inf', now)
  cs[i] = redis.call('ZCARD', KEYS[3*i])
end
local function result(code)
  local out = {code}
  for i = 1, n do out[#out+1] = rs[i]; out[#out+1] = ts[i]; out[#out+1] = cs[i] end
  return out
end
for i = 1, n do read(i) end
`

var (
	takeScript = redis.NewScript(luaPrelude + `
for i = 1, n do
  if lim(i, 2) > 0 and ts[i] >= lim(i, 2) then return result(10*i + 2) end
  if lim(i, 1) > 0 and rs[i] >= lim(i, 1) then return result(10*i + 1) end
end
for i = 1, n do
  rs[i] = redis.call('INCR', KEYS[3*i-2])
  if rs[i] == 1 then redis.call('PEXPIRE', KEYS[3*i-2], ARGV[2]) end
end
return result(0)
`)
	addTokensScript = redis.NewScript(luaPrelude + `
for i = 1, n do
  ts[i] = redis.call('INCRBY', KEYS[3*i-1], ARGV[4])
  if redis.call('PTTL', KEYS[3*i-1]) < 0 then redis.call('PEXPIRE', KEYS[3*i-1], ARGV[3]) end
end
for i = 1, n do
  if lim(i, 2) > 0 and ts[i] >= lim(i, 2) then return result(10*i + 2) end
end
return result(0)
`)
	acquireScript = redis.NewScript(luaPrelude + `
for i = 1, n do
  if lim(i, 3) > 0 and cs[i] >= lim(i, 3) then return result(10*i + 3) end
end
local expires = tonumber(ARGV[4])
for i = 1, n do
  redis.call('ZADD', KEYS[3*i], expires, ARGV[5])
  redis.call('PEXPIRE', KEYS[3*i], expires - now)
  cs[i] = cs[i] + 1
end
return result(0)
`)
	usageScript   = redis.NewScript(luaPrelude + `return result(0)`)
	releaseScript = redis.NewScript(`
for i = 1, #KEYS / 3 do redis.call('ZREM', KEYS[3*i], ARGV[5]) end
return 0
`)
)

type redisStore struct{ client redis.UniversalClient }

func (s *redisStore) run(ctx context.Context, script *redis.Script, r request, opArg int64, leaseID string) (result, error) {
	keys := make([]string, 0, 3*len(r.scopes))
	args := make([]any, 0, 5+3*len(r.scopes))
	nowMS := r.now.UnixMilli()
	args = append(args, nowMS, rpmTTL.Milliseconds(), tokTTL.Milliseconds(), opArg, leaseID)
	for _, sc := range r.scopes {
		keys = append(keys, sc.rpmKey, sc.tokKey, sc.leaseKey)
		args = append(args, sc.limits.RequestsPerMinute, sc.limits.TokensPerDay, sc.limits.ConcurrentToolCalls)
	}
	vals, err := script.Run(ctx, s.client, keys, args...).Int64Slice()
	if err != nil {
		return result{}, fmt.Errorf("redis: %w", err)
	}
	if len(vals) != 1+3*len(r.scopes) {
		return result{}, fmt.Errorf("redis: script returned %d values, want %d", len(vals), 1+3*len(r.scopes))
	}
	res := result{counts: make([]counts, len(r.scopes))}
	if code := vals[0]; code != 0 {
		res.scope, res.refused = int(code/10)-1, limit(code%10)
	}
	for i := range r.scopes {
		res.counts[i] = counts{vals[1+3*i], vals[2+3*i], vals[3+3*i]}
	}
	return res, nil
}

func (s *redisStore) take(ctx context.Context, r request) (result, error) {
	return s.run(ctx, takeScript, r, 0, "")
}

func (s *redisStore) addTokens(ctx context.Context, r request, n int64) (result, error) {
	return s.run(ctx, addTokensScript, r, n, "")
}

func (s *redisStore) acquire(ctx context.Context, r request, id string) (result, error) {
	return s.run(ctx, acquireScript, r, r.now.Add(r.lease).UnixMilli(), id)
}

func (s *redisStore) release(ctx context.Context, r request, id string) error {
	keys := make([]string, 0, 3*len(r.scopes))
	for _, sc := range r.scopes {
		keys = append(keys, sc.rpmKey, sc.tokKey, sc.leaseKey)
	}
	if err := releaseScript.Run(ctx, s.client, keys, 0, 0, 0, 0, id).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}

func (s *redisStore) usage(ctx context.Context, r request) (result, error) {
	return s.run(ctx, usageScript, r, 0, "")
}
