package limits_test

import (
	"context"
	"testing"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/limits"
)

// roomyLimits are limits the benchmarks never reach, with a template total as the example
// config has: every call is allowed and counted in both scopes.
func roomyLimits() config.Limits {
	set := config.LimitSet{RequestsPerMinute: 1 << 40, TokensPerDay: 1 << 40, ConcurrentToolCalls: 1 << 20}
	return config.Limits{Templates: map[string]config.TemplateLimits{"coding-agent": {LimitSet: set, Total: set}}}
}

// What a routed model request costs the limits on the in-memory store: Take before it is
// forwarded (its Usage is the policy input's) and AddTokens when the response reported its
// usage; a tools/call's Acquire and release.
func BenchmarkRouteRequestLimits(b *testing.B) {
	l := limits.NewMemory(roomyLimits(), limits.WithClock(newClock().Now))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, v, err := l.Take(ctx, alice); err != nil || !v.Allowed {
			b.Fatal(v, err)
		}
		if v, err := l.AddTokens(ctx, alice, 1); err != nil || !v.Allowed {
			b.Fatal(v, err)
		}
	}
}

func BenchmarkToolCallSlot(b *testing.B) {
	l := limits.NewMemory(roomyLimits(), limits.WithClock(newClock().Now))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		release, v, err := l.Acquire(ctx, alice)
		if err != nil || !v.Allowed {
			b.Fatal(v, err)
		}
		release()
	}
}
