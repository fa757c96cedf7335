package redistest

import (
	"context"
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
