package redisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/sandgate/sandgate/internal/config"
)

// Passwords are the values of the credentials the redis section names ("" for none).
type Passwords struct {
	// Redis is redis.password_credential's value: the data nodes' (ACL user's) password.
	Redis string
	// Sentinel is redis.sentinel.password_credential's value.
	Sentinel string
}

// New returns a client for cfg's topology (a single node, Sentinel or Cluster; cfg.Enabled() must
// hold), with TLS when cfg.TLS is set. Each command is bounded by cfg.OpTimeout and by the
// caller's context deadline, which (ContextTimeoutEnabled) also bounds dialing, the connection
// handshake and the pool wait; cfg.DialTimeout caps one dial attempt (background work without a
// deadline of its own relies on it). Failed commands are not retried, since the
// callers have their own failure modes and retries (a retry would double the worst-case delay).
// A Cluster client still follows MOVED and ASK redirections: they are answers, not failures.
func New(cfg config.Redis, pw Passwords) (redis.UniversalClient, error) {
	tlsConfig, err := TLSConfig(cfg.TLS)
	if err != nil {
		return nil, err
	}
	o := &redis.UniversalOptions{
		Username:              cfg.Username,
		Password:              pw.Redis,
		DB:                    cfg.DB,
		TLSConfig:             tlsConfig,
		DialTimeout:           cfg.DialTimeout.D(),
		ReadTimeout:           cfg.OpTimeout.D(),
		WriteTimeout:          cfg.OpTimeout.D(),
		PoolTimeout:           cfg.OpTimeout.D(),
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DisableIdentity:       true,
		// Redis 7.0 knows no CLIENT MAINT_NOTIFICATIONS; asking on every connect only costs a round trip.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	switch {
	case cfg.Sentinel != nil:
		o.MasterName, o.Addrs = cfg.Sentinel.MasterName, cfg.Sentinel.Addrs
		o.SentinelPassword = pw.Sentinel
		return redis.NewFailoverClient(o.Failover()), nil
	case cfg.Cluster != nil:
		o.Addrs = cfg.Cluster.Addrs
		return redis.NewClusterClient(o.Cluster()), nil
	case cfg.Addr != "":
		o.Addrs = []string{cfg.Addr}
		return redis.NewClient(o.Simple()), nil
	}
	return nil, errors.New("redis: no topology configured (redis.addr, redis.sentinel or redis.cluster)")
}

// TLSConfig returns the client TLS configuration for t (nil for none); see config.ClientTLS.
func TLSConfig(t *config.RedisTLS) (*tls.Config, error) { return t.Config("redis.tls") }

// Check pings Redis, for readiness: nil when it answers within ctx. A Cluster client pings
// every primary it knows, so one unreachable shard is reported.
func Check(ctx context.Context, c redis.UniversalClient) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			if err := n.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("%s: %w", n.Options().Addr, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("redis cluster: %w", err)
		}
		return nil
	}
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}
