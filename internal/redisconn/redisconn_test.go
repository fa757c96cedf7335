package redisconn_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/redisconn"
	"github.com/sandgate/sandgate/test/redistest"
)

// outages are the ways a Redis server goes away in these tests, and how it comes back.
var outages = []struct {
	name            string
	hung            bool // paused (SIGSTOP): commands sent meanwhile run when it resumes
	outage, recover func(*redistest.Server)
}{
	{"a hung server", true, (*redistest.Server).Pause, (*redistest.Server).Resume},
	{"a stopped server", false, (*redistest.Server).Stop, (*redistest.Server).Restart},
}

func TestClientCallsAreBoundedByOpTimeout(t *testing.T) {
	srv := redistest.Start(t)
	c, err := redisconn.New(config.Redis{
		Addr:        srv.Addr,
		DialTimeout: config.Duration(time.Second),
		OpTimeout:   config.Duration(200 * time.Millisecond),
	}, redisconn.Passwords{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	require.Eventually(t, func() bool { return redisconn.Check(ctx, c) == nil }, 10*time.Second, 50*time.Millisecond)

	for _, tc := range outages {
		t.Run(tc.name, func(t *testing.T) {
			tc.outage(srv)
			start := time.Now()
			err := c.Set(ctx, "k", "v", 0).Err() // no deadline of its own: op_timeout bounds it
			assert.Error(t, err)
			assert.Less(t, time.Since(start), 3*time.Second)
			tc.recover(srv)
			assert.Eventually(t, func() bool { return redisconn.Check(ctx, c) == nil }, 10*time.Second, 50*time.Millisecond)
		})
	}
}

func TestTopologies(t *testing.T) {
	single, cluster := redistest.Start(t), redistest.StartCluster(t, 3)
	tlsSrv, files := redistest.StartTLS(t)
	otherCA := redistest.MakeTLSFiles(t)
	timeouts := func(r config.Redis) config.Redis {
		r.DialTimeout, r.OpTimeout = config.Duration(2*time.Second), config.Duration(2*time.Second)
		return r
	}
	for _, tc := range []struct {
		name  string
		cfg   config.Redis
		works bool
	}{
		{"a single node", config.Redis{Addr: single.Addr}, true},
		{"a cluster found from one seed", config.Redis{Cluster: &config.RedisCluster{Addrs: cluster.Addrs[:1]}}, true},
		{"TLS verified against the CA", config.Redis{Addr: tlsSrv.Addr, TLS: &config.RedisTLS{CAFile: files.CA}}, true},
		{"TLS with a client certificate", config.Redis{Addr: tlsSrv.Addr, TLS: &config.RedisTLS{
			CAFile: files.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey, ServerName: "localhost"}}, true},
		{"TLS against another CA is refused", config.Redis{Addr: tlsSrv.Addr, TLS: &config.RedisTLS{CAFile: otherCA.CA}}, false},
		{"TLS under a name the certificate lacks is refused", config.Redis{Addr: tlsSrv.Addr, TLS: &config.RedisTLS{
			CAFile: files.CA, ServerName: "redis.example"}}, false},
		{"plain text to a TLS-only server fails", config.Redis{Addr: tlsSrv.Addr}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := redisconn.New(timeouts(tc.cfg), redisconn.Passwords{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = redisconn.Check(ctx, c)
			if !tc.works {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			for _, k := range []string{"a", "b", "c", "d"} { // in a cluster: more than one primary
				require.NoError(t, c.Set(ctx, k, "v", time.Minute).Err())
			}
		})
	}
}

func TestACLUserAndPassword(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, srv.Client(t).Do(ctx, "ACL", "SETUSER", "sandgate", "on", ">s3cret", "~*", "+@all").Err())
	for _, tc := range []struct {
		name, user, password string
		works                bool
	}{
		{"the ACL user with its password", "sandgate", "s3cret", true},
		{"the ACL user with a wrong password", "sandgate", "nope", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := redisconn.New(config.Redis{Addr: srv.Addr, Username: tc.user,
				DialTimeout: config.Duration(time.Second), OpTimeout: config.Duration(time.Second)},
				redisconn.Passwords{Redis: tc.password})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			assert.Equal(t, tc.works, redisconn.Check(ctx, c) == nil)
		})
	}
}

func TestTLSConfigErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	notPEM := dir + "/not.pem"
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	for _, tc := range []struct {
		name string
		tls  config.RedisTLS
		want string
	}{
		{"missing CA file", config.RedisTLS{CAFile: dir + "/none.pem"}, "redis.tls.ca_file:"},
		{"CA file without a certificate", config.RedisTLS{CAFile: notPEM}, "redis.tls.ca_file: " + notPEM + " holds no PEM certificate"},
		{"client key that does not parse", config.RedisTLS{CertFile: notPEM, KeyFile: notPEM}, "redis.tls.cert_file, redis.tls.key_file:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := redisconn.TLSConfig(&tc.tls)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestOneDeadlineBoundsDialAndPoolWait: with a dial_timeout far longer than op_timeout, a fresh
// client's calls to a hung or stopped server (dial, handshake, retries of the dial) and the calls
// queued for a pooled connection behind them (more callers than the pool holds) all return within
// about op_timeout: the context deadline of the call bounds it all, not dial_timeout.
func TestOneDeadlineBoundsDialAndPoolWait(t *testing.T) {
	srv := redistest.Start(t)
	const op = 300 * time.Millisecond
	for _, tc := range outages {
		t.Run(tc.name, func(t *testing.T) {
			c, err := redisconn.New(config.Redis{Addr: srv.Addr, DialTimeout: config.Duration(10 * time.Second), OpTimeout: config.Duration(op)}, redisconn.Passwords{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			tc.outage(srv)
			t.Cleanup(func() { tc.recover(srv) })
			const callers = 60 // more than the pool's 10 per CPU
			took := make(chan time.Duration, callers)
			for range callers {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), op) // as the request path does
					defer cancel()
					start := time.Now()
					_ = c.Set(ctx, "k", "v", 0).Err()
					took <- time.Since(start)
				}()
			}
			var worst time.Duration
			for range callers {
				worst = max(worst, <-took)
			}
			t.Logf("%s: slowest of %d calls %s (op_timeout %s, dial_timeout 10s)", tc.name, callers, worst, op)
			assert.Less(t, worst, op+2*time.Second, "bounded by op_timeout, not by dial_timeout (10s)")
		})
	}
}
