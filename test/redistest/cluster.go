package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Cluster is a Redis Cluster, owned by a test.
type Cluster struct {
	// Addrs are the nodes' "127.0.0.1:PORT" (primaries first, as created).
	Addrs []string
	Nodes []*Server
}

// StartCluster launches n (at least 3) cluster-enabled redis-servers on loopback, joins them
// with redis-cli --cluster create (the slots split evenly, no replicas) and waits until every node
// reports cluster_state:ok. The servers are killed when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return startCluster(t, n, 0, 5000)
}

// StartClusterWithReplicas is StartCluster with one replica per primary (2n nodes), and a node
// timeout of 1s: a replica takes over a failed primary within a few seconds. It waits until
// every replica is in sync.
func StartClusterWithReplicas(t testing.TB, n int) *Cluster {
	t.Helper()
	c := startCluster(t, n, 1, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, s := range c.Nodes {
		node := s.Client(t)
		for {
			info, err := node.Info(ctx, "replication").Result()
			if err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")) {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("redistest: cluster replica %s not in sync within %s: %v", s.Addr, startTimeout, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return c
}

func startCluster(t testing.TB, n, replicas, nodeTimeoutMS int) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("redistest: a Redis Cluster needs at least 3 primaries, asked for %d", n)
	}
	cli := tool(t, "redis-cli")
	c := &Cluster{}
	for range n * (1 + replicas) {
		s := startClusterNode(t, nodeTimeoutMS)
		c.Nodes, c.Addrs = append(c.Nodes, s), append(c.Addrs, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	args := append(append([]string{"--cluster", "create"}, c.Addrs...), "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, tail(string(out), 2000))
	}
	for _, s := range c.Nodes {
		node := s.Client(t)
		for {
			info, err := node.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("redistest: cluster node %s not ok within %s: %v %s", s.Addr, startTimeout, err, info)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return c
}

// Client returns a cluster client with short timeouts, closed when the test ends. It sees the
// whole cluster once the first command has loaded the slot map.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 c.Addrs,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DisableIdentity:       true,
		Protocol:              2,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// NodeFor returns the node that is primary for key's slot now (it changes on failover).
func (c *Cluster) NodeFor(ctx context.Context, t testing.TB, key string) (*Server, error) {
	client := c.Client(t)
	slot, err := client.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	shards, err := client.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if int64(r.Start) > slot || slot > int64(r.End) {
				continue
			}
			for _, n := range sh.Nodes {
				for _, s := range c.Nodes {
					if n.Role == "master" && n.Health == "online" && s.Addr == fmt.Sprintf("%s:%d", n.IP, n.Port) {
						return s, nil
					}
				}
			}
		}
	}
	return nil, fmt.Errorf("no node serves slot %d", slot)
}

// startClusterNode starts one cluster-enabled redis-server. Its cluster bus gets a free port of
// its own (by default it is the client port + 10000, which another process may hold), and a
// node that lost a port to another process between freePort and its bind is started again on
// new ports.
func startClusterNode(t testing.TB, nodeTimeoutMS int) *Server {
	t.Helper()
	for attempt := 1; ; attempt++ {
		s := newServer(t, "redis-server")
		bus, err := freePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.args = []string{"--cluster-enabled", "yes", "--cluster-config-file", s.dir + "/nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(nodeTimeoutMS), "--cluster-port", strconv.Itoa(bus)}
		t.Cleanup(s.kill)
		err = s.start()
		if err == nil {
			return s
		}
		if attempt >= 3 || !strings.Contains(err.Error(), "Address already in use") {
			t.Fatalf("redistest: %v", err)
		}
	}
}
