package redistest

import (
	"context"
	"testing"
	"time"
)

func TestSentinelFailsOverWhenThePrimaryDies(t *testing.T) {
	s := StartSentinel(t)
	c := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set through sentinel: %v", err)
	}
	old, err := s.PrimaryAddr(ctx, t)
	if err != nil || old != s.Primary.Addr {
		t.Fatalf("primary is %q (%v), want %s", old, err, s.Primary.Addr)
	}
	s.Primary.Stop()
	now := s.AwaitPrimary(t, old, 45*time.Second)
	if now != s.Replica.Addr {
		t.Fatalf("new primary %s, want the replica %s", now, s.Replica.Addr)
	}
	for {
		if err := c.Set(ctx, "k2", "v", 0).Err(); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("the client never reached the new primary: %v", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}
