package redistest

import (
	"context"
	"crypto/tls"
	"testing"
	"time"
)

func TestServerStopRestartPause(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set: %v", err)
	}

	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded against a stopped server")
	}

	s.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
	if n, _ := c.Exists(ctx, "k").Result(); n != 0 {
		t.Fatal("data survived a restart without persistence")
	}

	s.Pause()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	start := time.Now()
	err := c.Ping(short).Err()
	cancel()
	if err == nil {
		t.Fatal("ping answered by a paused server")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("ping against a paused server took %s despite a 200ms deadline", d)
	}
	s.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after resume: %v", err)
	}
}

func TestClusterServesEverySlot(t *testing.T) {
	c := StartCluster(t, 3)
	cc := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} { // spread over the three primaries
		if err := cc.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
	}
	if n, err := cc.DBSize(ctx).Result(); err != nil || n != 6 {
		t.Fatalf("cluster holds %d keys (%v), want 6", n, err)
	}
}

func TestTLSServerIsVerified(t *testing.T) {
	s, files := StartTLS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ping(ctx, s.Addr, nil); err == nil {
		t.Fatal("a plain-text PING was answered by a TLS-only server")
	}
	if err := ping(ctx, s.Addr, &tls.Config{ServerName: "127.0.0.1"}); err == nil {
		t.Fatal("the server's certificate was accepted without the test CA")
	}
	if files.ClientCert == "" || files.ClientKey == "" {
		t.Fatal("no client certificate made")
	}
}
