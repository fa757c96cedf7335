package bench

import (
	"context"
	"testing"

	"github.com/sandgate/sandgate/test/redistest"
)

// commandCalls counts every command run (a script's inner calls too) and the scripts apart,
// once the measurement's own INFO call is taken off.
func TestCommandCallsCountsRoundTripsAndCommandsRun(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	nodes := []redisNode{{addr: srv.Addr}}
	if err := c.Ping(ctx).Err(); err != nil { // connected (HELLO) before the first sample
		t.Fatal(err)
	}
	run0, scripts0 := commandCalls(ctx, nodes)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Eval(ctx, "redis.call('SET', KEYS[1], 'a'); redis.call('GET', KEYS[1]); return redis.call('DEL', KEYS[1])", []string{"k"}).Err(); err != nil {
		t.Fatal(err)
	}
	run1, scripts1 := commandCalls(ctx, nodes)
	extra := int64(len(nodes))
	if got := scripts1 - scripts0; got != 1 {
		t.Errorf("scripts: got %d, want 1", got)
	}
	if got := run1 - run0 - extra; got != 5 {
		t.Errorf("commands run: got %d, want 5 (SET, EVAL and its SET, GET, DEL)", got)
	}
}
