package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the sentinels of StartSentinel monitor the primary under.
const SentinelMaster = "sandgate-test"

// Sentinel is a primary, one replica of it and three sentinels monitoring them, owned by a test.
type Sentinel struct {
	// Primary and Replica are the data nodes as started; after a failover their roles swap.
	Primary, Replica *Server
	// Sentinels run redis-server --sentinel; SentinelAddrs are their "127.0.0.1:PORT".
	Sentinels     []*Server
	SentinelAddrs []string
}

// StartSentinel launches a primary, a replica of it and three sentinels (quorum 2, the primary
// judged down after 1s of silence), on loopback, and waits until the replica is in sync and every
// sentinel knows the replica and the other sentinels. Everything is killed when the test ends.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	s := &Sentinel{Primary: Start(t)}
	s.Replica = startServer(t, "redis-server", []string{"--replicaof", "127.0.0.1", portOf(s.Primary.Addr)}, nil)
	for range 3 {
		sn := newServer(t, "redis-server")
		conf := filepath.Join(sn.dir, "sentinel.conf")
		err := os.WriteFile(conf, []byte(strings.Join([]string{
			"sentinel monitor " + SentinelMaster + " 127.0.0.1 " + portOf(s.Primary.Addr) + " 2",
			"sentinel down-after-milliseconds " + SentinelMaster + " 1000",
			"sentinel failover-timeout " + SentinelMaster + " 10000",
			"sentinel parallel-syncs " + SentinelMaster + " 1",
			"sentinel resolve-hostnames no",
		}, "\n")+"\n"), 0o600)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		sn.conf = conf
		t.Cleanup(sn.kill)
		if err := sn.start(); err != nil {
			t.Fatalf("redistest: sentinel: %v", err)
		}
		s.Sentinels, s.SentinelAddrs = append(s.Sentinels, sn), append(s.SentinelAddrs, sn.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*startTimeout)
	defer cancel()
	s.await(ctx, t, "the replica in sync", func(ctx context.Context) bool {
		info, err := s.Replica.Client(t).Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	for _, sn := range s.Sentinels {
		c := sn.Client(t)
		s.await(ctx, t, "sentinel "+sn.Addr+" to know the replica and its peers", func(ctx context.Context) bool {
			m, err := c.Do(ctx, "SENTINEL", "MASTER", SentinelMaster).Result()
			if err != nil {
				return false
			}
			f := fields(m)
			return f["num-slaves"] == "1" && f["num-other-sentinels"] == "2" && f["flags"] == "master"
		})
	}
	return s
}

// PrimaryAddr asks a sentinel for the primary's address now (it changes on failover).
func (s *Sentinel) PrimaryAddr(ctx context.Context, t testing.TB) (string, error) {
	var last error
	for _, sn := range s.Sentinels {
		if !sn.running() {
			continue
		}
		addr, err := sn.Client(t).Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster).StringSlice()
		if err == nil && len(addr) == 2 {
			return net.JoinHostPort(addr[0], addr[1]), nil
		}
		last = err
	}
	return "", fmt.Errorf("no sentinel names the primary: %v", last)
}

// AwaitPrimary waits until every sentinel names a primary other than old and that server says
// it is a primary, and returns its address.
func (s *Sentinel) AwaitPrimary(t testing.TB, old string, within time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var now string
	s.await(ctx, t, "a new primary after "+old, func(ctx context.Context) bool {
		addr, err := s.PrimaryAddr(ctx, t)
		if err != nil || addr == old {
			return false
		}
		for _, n := range []*Server{s.Primary, s.Replica} {
			if n.Addr == addr {
				info, err := n.Client(t).Info(ctx, "replication").Result()
				now = addr
				return err == nil && strings.Contains(info, "role:master")
			}
		}
		return false
	})
	return now
}

// Client returns a Sentinel-aware client with short timeouts, closed when the test ends.
func (s *Sentinel) Client(t testing.TB) redis.UniversalClient {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            SentinelMaster,
		SentinelAddrs:         s.SentinelAddrs,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DisableIdentity:       true,
		Protocol:              2,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// await polls ok every 50ms until it holds, failing the test when ctx ends first.
func (s *Sentinel) await(ctx context.Context, t testing.TB, what string, ok func(context.Context) bool) {
	t.Helper()
	for {
		short, cancel := context.WithTimeout(ctx, time.Second)
		done := ok(short)
		cancel()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: waiting for %s: %v", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// fields turns a flat [k1 v1 k2 v2 ...] or map reply into a map.
func fields(v any) map[string]string {
	out := map[string]string{}
	switch r := v.(type) {
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			out[fmt.Sprint(r[i])] = fmt.Sprint(r[i+1])
		}
	case map[any]any:
		for k, v := range r {
			out[fmt.Sprint(k)] = fmt.Sprint(v)
		}
	}
	return out
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	if _, err := strconv.Atoi(p); err != nil {
		return addr
	}
	return p
}

func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}
