package redisconn

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/sandgate/sandgate/internal/config"
)

// New returns a client for cfg (cfg.Addr must be set). password is the value of
// cfg.PasswordCredential ("" for none). Dial is bounded by cfg.DialTimeout, each command by
// cfg.OpTimeout and by the caller's context deadline; failed commands are not retried, since the
// callers have their own failure modes and retries (a retry would double the worst-case delay).
func New(cfg config.Redis, password string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  cfg.Addr,
		Password:              password,
		DB:                    cfg.DB,
		DialTimeout:           cfg.DialTimeout.D(),
		ReadTimeout:           cfg.OpTimeout.D(),
		WriteTimeout:          cfg.OpTimeout.D(),
		PoolTimeout:           cfg.OpTimeout.D(),
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DisableIdentity:       true,
		// Redis 7.0 knows no CLIENT MAINT_NOTIFICATIONS; asking on every connect only costs a round trip.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// Check pings Redis, for readiness: nil when it answers within ctx.
func Check(ctx context.Context, c redis.UniversalClient) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}
