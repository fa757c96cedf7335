package limits

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/internal/config"
)

// NewRedis returns a Limiter whose counters live in Redis under prefix (config redis.key_prefix),
// shared by every replica using the same Redis and prefix. A sandbox's counters carry its own hash
// tag, and a template's totals theirs, so that in a Redis Cluster the counters spread over the
// shards by sandbox and each script touches one slot (docs/shared-state.md has the key layout).
//
// The client's own timeouts should not be longer than WithTimeout's, and the client should have
// ContextTimeoutEnabled so the deadline also bounds a hung connection.
func NewRedis(client redis.UniversalClient, prefix string, cfg config.Limits, opts ...Option) *Limiter {
	return newLimiter(newRedisStore(client), prefix, cfg, opts)
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

// untakeScript gives back the request a take counted, in the scopes of KEYS (a take refused by a
// later scope in a Redis Cluster, where each scope is its own script).
var untakeScript = redis.NewScript(`
for i = 1, #KEYS / 3 do
  if redis.call('EXISTS', KEYS[3*i-2]) == 1 then redis.call('DECR', KEYS[3*i-2]) end
end
return 0
`)

// redisStore runs the scripts. On a single node or behind Sentinel one script covers every scope
// of a call, atomically. In a Cluster the sandbox's keys and its template's keys sit in different
// hash slots (see Limiter.request), so split runs one script per scope, in order, and undoes the
// earlier scopes' take or acquire when a later scope refuses: counters never exceed a limit, but
// a call refused by its template may briefly hold a sandbox slot or request another call sees.
type redisStore struct {
	client redis.UniversalClient
	split  bool
}

func newRedisStore(client redis.UniversalClient) *redisStore {
	_, cluster := client.(*redis.ClusterClient)
	return &redisStore{client: client, split: cluster}
}

// scopeKeys lists the three keys of each scope, in the order the scripts read them.
func scopeKeys(scopes []scope) []string {
	keys := make([]string, 0, 3*len(scopes))
	for _, sc := range scopes {
		keys = append(keys, sc.rpmKey, sc.tokKey, sc.leaseKey)
	}
	return keys
}

// runScopes runs script over scopes (all of a request, or one in a Cluster).
func (s *redisStore) runScopes(ctx context.Context, script *redis.Script, r request, scopes []scope, opArg int64, leaseID string) (result, error) {
	args := make([]any, 0, 5+3*len(scopes))
	args = append(args, r.now.UnixMilli(), rpmTTL.Milliseconds(), tokTTL.Milliseconds(), opArg, leaseID)
	for _, sc := range scopes {
		args = append(args, sc.limits.RequestsPerMinute, sc.limits.TokensPerDay, sc.limits.ConcurrentToolCalls)
	}
	vals, err := script.Run(ctx, s.client, scopeKeys(scopes), args...).Int64Slice()
	if err != nil {
		return result{}, fmt.Errorf("redis: %w", err)
	}
	if len(vals) != 1+3*len(scopes) {
		return result{}, fmt.Errorf("redis: script returned %d values, want %d", len(vals), 1+3*len(scopes))
	}
	var res result
	if code := vals[0]; code != 0 {
		res.scope, res.refused = int(code/10)-1, limit(code%10)
	}
	for i := range scopes {
		res.counts[i] = counts{vals[1+3*i], vals[2+3*i], vals[3+3*i]}
	}
	return res, nil
}

// run runs script over every scope of r: in one call, or in a Cluster scope by scope. undo, when
// set, reverts the script's effect in the scopes before the one that refused, and in their counts.
func (s *redisStore) run(ctx context.Context, script *redis.Script, r request, opArg int64, leaseID string, undo func([]scope, []counts) error) (result, error) {
	if !s.split || len(r.scopes) < 2 {
		return s.runScopes(ctx, script, r, r.scopes, opArg, leaseID)
	}
	var out result
	for i := range r.scopes {
		res, err := s.runScopes(ctx, script, r, r.scopes[i:i+1], opArg, leaseID)
		if err == nil && res.refused != limitNone && undo != nil && i > 0 {
			err = undo(r.scopes[:i], out.counts[:i])
		}
		if err != nil {
			return result{}, err
		}
		out.counts[i] = res.counts[0]
		if res.refused != limitNone && out.refused == limitNone {
			out.refused, out.scope = res.refused, i
			if undo != nil {
				return out, nil
			}
		}
	}
	return out, nil
}

func (s *redisStore) take(ctx context.Context, r request) (result, error) {
	return s.run(ctx, takeScript, r, 0, "", func(done []scope, c []counts) error {
		for i := range c {
			c[i].requests--
		}
		return s.runScript(ctx, untakeScript, done, "")
	})
}

func (s *redisStore) addTokens(ctx context.Context, r request, n int64) (result, error) {
	return s.run(ctx, addTokensScript, r, n, "", nil) // tokens are spent: every scope is charged
}

func (s *redisStore) acquire(ctx context.Context, r request, id string) (result, error) {
	return s.run(ctx, acquireScript, r, r.now.Add(r.lease).UnixMilli(), id, func(done []scope, c []counts) error {
		for i := range c {
			c[i].concurrent--
		}
		return s.runScript(ctx, releaseScript, done, id)
	})
}

func (s *redisStore) release(ctx context.Context, r request, id string) error {
	if !s.split {
		return s.runScript(ctx, releaseScript, r.scopes, id)
	}
	for i := range r.scopes {
		if err := s.runScript(ctx, releaseScript, r.scopes[i:i+1], id); err != nil {
			return err
		}
	}
	return nil
}

// runScript runs a script that returns nothing of interest (release, untake) over scopes.
func (s *redisStore) runScript(ctx context.Context, script *redis.Script, scopes []scope, id string) error {
	if err := script.Run(ctx, s.client, scopeKeys(scopes), 0, 0, 0, 0, id).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}

func (s *redisStore) usage(ctx context.Context, r request) (result, error) {
	return s.run(ctx, usageScript, r, 0, "", nil)
}
