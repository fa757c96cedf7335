package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/test/redistest"
)

// failoverRPM is triage-1's requests per minute in the failover tests. The documented bound on
// the overshoot of a limit across one failover is one window's worth: the promoted node may have
// missed the counter's latest increments (asynchronous replication), at worst all of them.
const failoverRPM = 20

// topology is the Redis under the replicas of a failover test.
type topology struct {
	name      string
	redisYAML string
	client    redis.UniversalClient
	// fail kills the node that holds triage-1's counters and returns its address.
	fail func(t *testing.T) string
}

// TestThreeReplicasThroughASentinelFailover runs three replicas on a primary + replica + 3
// sentinels, checks that they share grants and MCP sessions, then kills the primary mid-load.
func TestThreeReplicasThroughASentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t)
	runFailover(t, topology{
		name: "sentinel",
		redisYAML: fmt.Sprintf("{sentinel: {master_name: %s, addrs: [%s]}, op_timeout: 500ms, dial_timeout: 500ms}",
			redistest.SentinelMaster, strings.Join(s.SentinelAddrs, ", ")),
		client: s.Client(t),
		fail: func(t *testing.T) string {
			s.Primary.Stop()
			return s.Primary.Addr
		},
	})
}

// TestThreeReplicasThroughARedisRestart does the same on one redis-server without persistence
// that is killed and restarted empty: the worst case of the documented bounds (every counter and
// the stream's earlier entries are gone).
func TestThreeReplicasThroughARedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	runFailover(t, topology{
		name:      "single",
		redisYAML: fmt.Sprintf("{addr: %q, op_timeout: 500ms, dial_timeout: 500ms}", srv.Addr),
		client:    srv.Client(t),
		fail: func(t *testing.T) string {
			srv.Stop()
			srv.Restart()
			return srv.Addr
		},
	})
}

// TestThreeReplicasThroughAClusterMasterFailure does the same on a 3-primary Cluster with one
// replica each, killing the primary of triage-1's counters' slot.
func TestThreeReplicasThroughAClusterMasterFailure(t *testing.T) {
	c := redistest.StartClusterWithReplicas(t, 3)
	runFailover(t, topology{
		name:      "cluster",
		redisYAML: fmt.Sprintf("{cluster: {addrs: [%s]}, op_timeout: 500ms, dial_timeout: 500ms}", strings.Join(c.Addrs, ", ")),
		client:    c.Client(t),
		fail: func(t *testing.T) string {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			node, err := c.NodeFor(ctx, t, "{sb:agents/triage-1}")
			require.NoError(t, err)
			node.Stop()
			return node.Addr
		},
	})
}

func runFailover(t *testing.T, top topology) {
	github, model := githubUpstream(t), modelAPI(t)
	templates := fmt.Sprintf("{triage-agent: {requests_per_minute: %d}, coding-agent: {}}", failoverRPM)
	var rs []*replica
	for i := range 3 {
		rs = append(rs, startReplicaOn(t, fmt.Sprintf("%s-%d", top.name, i), top.redisYAML, templates, github, model))
	}
	checkSharedGrantAndSession(t, rs)

	l := &failoverLoad{replicas: rs}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { l.run(stop) })
	t.Cleanup(func() { close(stop); wg.Wait() })
	require.Eventually(t, func() bool { return l.okSince(time.Time{}) >= 30 }, 30*time.Second, 20*time.Millisecond, "load before the failure")
	killedAt := time.Now()
	killed := top.fail(t)
	require.Eventually(t, func() bool { return l.okSince(killedAt) >= 30 }, 90*time.Second, 50*time.Millisecond,
		"calls succeed again after %s died", killed)
	close(stop)
	wg.Wait()
	stop = make(chan struct{})

	f := l.figures(killedAt)
	var events int
	require.Eventually(t, func() bool {
		events = 0
		for _, r := range rs {
			events += countKind(fileEventIDs(t, r.auditDir), audit.KindHTTPRequest)
		}
		return events >= f.answered
	}, 20*time.Second, 100*time.Millisecond)
	assert.Equal(t, f.answered, events, "one audit event per answered call, over the three replicas' files")
	assert.LessOrEqual(t, f.overshoot, failoverRPM, "a limit overshoots by at most one window across a failover")
	lost := streamLoss(t, top.client, rs)

	line := fmt.Sprintf("%s failover (killed %s): calls=%d answered=%d transport_errors=%d allowed=%d refused_503=%d refused_429=%d audit_events=%d stream_events_lost=%d rpm_limit=%d overshoot=%d recovery_s=%.2f",
		top.name, killed, f.calls, f.answered, f.calls-f.answered, f.allowed, f.unavailable, f.limited, events, lost, failoverRPM, f.overshoot, f.recovery.Seconds())
	t.Log(line)
	if path := os.Getenv("SANDGATE_FAILOVER_FIGURES"); path != "" {
		fh, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		_, _ = fmt.Fprintf(fh, "%s %s\n", time.Now().UTC().Format(time.RFC3339), line)
		require.NoError(t, fh.Close())
	}
}

// checkSharedGrantAndSession: a grant put on replica 0 is honoured on replica 2, and an MCP
// session made on replica 0 continues on replica 1.
func checkSharedGrantAndSession(t *testing.T, rs []*replica) {
	t.Helper()
	args := map[string]any{"owner": "acme", "repo": "api"}
	on2 := rs[2].mcpSession(t, coderAddr)
	ok, text := callTool(t, on2, "create_pull_request", args)
	require.False(t, ok, text)
	require.Equal(t, http.StatusOK, rs[0].putGrant(t, "agents/coder-1/github_repos", `{"value":["acme/api"],"ttl":"10m"}`, adminToken))
	ok, text = callTool(t, on2, "create_pull_request", args)
	assert.True(t, ok, "the grant put on replica 0 holds on replica 2: %s", text)

	lb := newBalancer(t, coderAddr)
	lb.to(rs[0])
	c := sessionThrough(t, lb)
	lb.to(rs[1])
	ok, text = callTool(t, c, "get_issue", nil)
	assert.True(t, ok, "the session made on replica 0 continues on replica 1: %s", text)
}

// failoverLoad sends model requests one after another, round-robin over the replicas,
// alternating an unlimited sandbox (coder-1) and a limited one (triage-1).
type failoverLoad struct {
	replicas []*replica
	mu       sync.Mutex
	calls    []loadCall
}

type loadCall struct {
	at     time.Time
	src    string
	status int // 0: no answer
}

func (l *failoverLoad) run(stop chan struct{}) {
	body := `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[]}`
	clients := map[string]*http.Client{coderAddr: fromAddr(coderAddr), triageAddr: fromAddr(triageAddr)}
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		src := []string{coderAddr, triageAddr}[i%2]
		r := l.replicas[(i/2)%len(l.replicas)]
		c := loadCall{at: time.Now(), src: src}
		resp, err := clients[src].Post("http://"+r.proxy+"/routes/anthropic/v1/messages", "application/json", strings.NewReader(body))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			c.status = resp.StatusCode
		}
		l.mu.Lock()
		l.calls = append(l.calls, c)
		l.mu.Unlock()
	}
}

// okSince counts coder-1's successful calls started after since.
func (l *failoverLoad) okSince(since time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.calls {
		if c.src == coderAddr && c.status == http.StatusOK && c.at.After(since) {
			n++
		}
	}
	return n
}

type failoverFigures struct {
	calls, answered, allowed, unavailable, limited, overshoot int
	recovery                                                  time.Duration
}

// figures counts the calls; recovery is from the kill to the first success of coder-1 after its
// last failure; overshoot is the most triage-1 calls allowed in one minute beyond its limit.
func (l *failoverLoad) figures(killedAt time.Time) failoverFigures {
	l.mu.Lock()
	defer l.mu.Unlock()
	var f failoverFigures
	perMinute := map[int64]int{}
	lastFailure := killedAt
	for _, c := range l.calls {
		f.calls++
		if c.status != 0 {
			f.answered++
		}
		switch c.status {
		case http.StatusOK:
			f.allowed++
			if c.src == triageAddr {
				perMinute[c.at.Unix()/60]++
			}
		case http.StatusServiceUnavailable:
			f.unavailable++
		case http.StatusTooManyRequests:
			f.limited++
		}
		if c.src == coderAddr && c.status != http.StatusOK && c.at.After(lastFailure) {
			lastFailure = c.at
		}
	}
	for _, n := range perMinute {
		f.overshoot = max(f.overshoot, n-failoverRPM)
	}
	for _, c := range l.calls {
		if c.src == coderAddr && c.status == http.StatusOK && c.at.After(lastFailure) {
			f.recovery = c.at.Sub(killedAt)
			break
		}
	}
	return f
}

// streamLoss waits until the replicas' mirrors have caught up (every event written after the
// failover is in the stream) and returns how many file events the stream lacks: those the
// failed node had acknowledged but not replicated.
func streamLoss(t *testing.T, rdb redis.UniversalClient, rs []*replica) int {
	t.Helper()
	var missing int
	require.Eventually(t, func() bool {
		res, err := audit.QueryRedis(context.Background(), rdb, "sandgate:audit", audit.Filter{Limit: -1})
		if err != nil {
			return false
		}
		in := map[string]bool{}
		for _, ev := range res.Events {
			in[ev.ID] = true
		}
		missing = 0
		for _, r := range rs {
			newest := time.Time{}
			for _, ev := range fileEventIDs(t, r.auditDir) {
				if !in[ev.ID] {
					missing++
				}
				if ev.Time.After(newest) {
					newest = ev.Time
				}
			}
			if !hasEventAt(res.Events, newest) {
				return false // this replica's newest event is not mirrored yet
			}
		}
		return true
	}, 30*time.Second, 200*time.Millisecond, "every replica's latest events reach the stream after the failover")
	return missing
}

func hasEventAt(evs []audit.Event, at time.Time) bool {
	for _, ev := range evs {
		if ev.Time.Equal(at) {
			return true
		}
	}
	return false
}
