package grants

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Store in Redis, shared by every replica. Redis 7.0 (Debian's) has no per-field
// expiry (HEXPIRE came in 7.4), so each sandbox is one hash whose fields hold "EXPIRY_MS:JSON";
// expired fields are removed when the hash is read or written, and the hash itself expires with
// its longest-lived grant. Expiry uses the Redis server's clock, so replicas' clocks do not matter.
type Redis struct {
	client  redis.UniversalClient
	prefix  string
	limits  limitsConfig
	timeout time.Duration
}

var _ Store = (*Redis)(nil)

// NewRedis returns a Store keeping grants under prefix + "grants:" + sandboxKey (prefix is config
// redis.key_prefix). Every call is bounded by the caller's context and by WithTimeout; a Get that fails
// returns the error, and the caller should then evaluate the policy without grants (which denies
// whatever needs one).
func NewRedis(client redis.UniversalClient, prefix string, opts ...Option) *Redis {
	l := newLimitsConfig(opts)
	return &Redis{client: client, prefix: prefix, limits: l, timeout: l.timeout}
}

// luaNow and luaPurge are shared by the scripts: the server time in ms, and removal of the expired
// fields of KEYS[1] returning the live ones as a flat name, value list.
const luaPurge = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function purge()
  local all = redis.call('HGETALL', KEYS[1])
  local live = {}
  for i = 1, #all, 2 do
    local v = all[i+1]
    local sep = string.find(v, ':', 1, true)
    if tonumber(string.sub(v, 1, sep - 1)) <= now then
      redis.call('HDEL', KEYS[1], all[i])
    else
      live[#live+1] = all[i]; live[#live+1] = string.sub(v, sep + 1)
    end
  end
  return live
end
`

var (
	// putScript: ARGV name, JSON value, ttl ms, max grants. Returns 1, or 0 when the sandbox has
	// too many grants.
	putScript = redis.NewScript(luaPurge + `
local ttl = tonumber(ARGV[3])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
  purge()
  if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], (now + ttl) .. ':' .. ARGV[2])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
`)
	getScript = redis.NewScript(luaPurge + `return purge()`)
)

func (r *Redis) key(sandboxKey string) string { return r.prefix + "grants:" + sandboxKey }

func (r *Redis) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout)
}

// Put implements Store.
func (r *Redis) Put(ctx context.Context, sandboxKey, name string, value any, ttl time.Duration) error {
	b, err := r.limits.checkPut(sandboxKey, name, value, ttl)
	if err != nil {
		return err
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	ok, err := putScript.Run(ctx, r.client, []string{r.key(sandboxKey)}, name, b, ttl.Milliseconds(), r.limits.maxGrants).Int()
	if err != nil {
		return fmt.Errorf("store grant %q of %s in redis: %w", name, sandboxKey, err)
	}
	if ok == 0 {
		return r.limits.tooMany(sandboxKey)
	}
	return nil
}

// Get implements Store.
func (r *Redis) Get(ctx context.Context, sandboxKey string) (map[string]any, error) {
	if err := checkKey(sandboxKey); err != nil {
		return nil, err
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	flat, err := getScript.Run(ctx, r.client, []string{r.key(sandboxKey)}).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read grants of %s from redis: %w", sandboxKey, err)
	}
	out := make(map[string]any, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		v, err := decode(flat[i], []byte(flat[i+1]))
		if err != nil {
			return nil, err
		}
		out[flat[i]] = v
	}
	return out, nil
}

// Delete implements Store.
func (r *Redis) Delete(ctx context.Context, sandboxKey, name string) error {
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	if err := r.client.HDel(ctx, r.key(sandboxKey), name).Err(); err != nil {
		return fmt.Errorf("delete grant %q of %s in redis: %w", name, sandboxKey, err)
	}
	return nil
}

// DeleteSandbox implements Store.
func (r *Redis) DeleteSandbox(ctx context.Context, sandboxKey string) error {
	if strings.TrimSpace(sandboxKey) == "" {
		return checkKey("")
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	if err := r.client.Del(ctx, r.key(sandboxKey)).Err(); err != nil {
		return fmt.Errorf("delete grants of %s in redis: %w", sandboxKey, err)
	}
	return nil
}

func (r *Redis) maxValueSize() int { return r.limits.maxValueSize }
