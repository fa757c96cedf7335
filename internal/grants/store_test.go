package grants_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/grants"
	"github.com/sandgate/sandgate/test/redistest"
)

// stores returns constructors of each Store implementation; each call of a constructor is a new
// replica over the same state (Redis: a fresh prefix per test on one server).
func stores(t *testing.T) map[string]func(t *testing.T) func(opts ...grants.Option) grants.Store {
	srv, cluster := redistest.Start(t), redistest.StartCluster(t, 3)
	var seq atomic.Int64
	return map[string]func(t *testing.T) func(opts ...grants.Option) grants.Store{
		"memory": func(*testing.T) func(...grants.Option) grants.Store {
			var m *grants.Memory
			return func(opts ...grants.Option) grants.Store {
				if m == nil {
					m = grants.NewMemory(opts...)
				}
				return m
			}
		},
		"redis": func(t *testing.T) func(...grants.Option) grants.Store {
			prefix := fmt.Sprintf("t%d:", seq.Add(1))
			return func(opts ...grants.Option) grants.Store {
				return grants.NewRedis(srv.Client(t), prefix, opts...)
			}
		},
		"redis cluster": func(t *testing.T) func(...grants.Option) grants.Store {
			prefix := fmt.Sprintf("t%d:", seq.Add(1))
			return func(opts ...grants.Option) grants.Store {
				return grants.NewRedis(cluster.Client(t), prefix, opts...)
			}
		},
	}
}

const alice, bob = "team-a/alice", "team-a/bob"

func TestStoreBehaviour(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		opts []grants.Option
		run  func(t *testing.T, s grants.Store)
	}{
		{"a grant put is read back as decoded JSON", nil, func(t *testing.T, s grants.Store) {
			require.NoError(t, s.Put(ctx, alice, "repo", map[string]any{"owner": "acme", "name": "widgets", "n": 3}, time.Minute))
			require.NoError(t, s.Put(ctx, alice, "read_only", true, time.Minute))
			g, err := s.Get(ctx, alice)
			require.NoError(t, err)
			assert.Equal(t, map[string]any{
				"repo":      map[string]any{"owner": "acme", "name": "widgets", "n": float64(3)},
				"read_only": true,
			}, g)
		}},
		{"a sandbox without grants reads as an empty map", nil, func(t *testing.T, s grants.Store) {
			g, err := s.Get(ctx, bob)
			require.NoError(t, err)
			assert.NotNil(t, g)
			assert.Empty(t, g)
		}},
		{"grants of one sandbox are invisible to another", nil, func(t *testing.T, s grants.Store) {
			require.NoError(t, s.Put(ctx, alice, "repo", "acme/widgets", time.Minute))
			g, err := s.Get(ctx, bob)
			require.NoError(t, err)
			assert.Empty(t, g)
		}},
		{"put replaces a grant of the same name", nil, func(t *testing.T, s grants.Store) {
			require.NoError(t, s.Put(ctx, alice, "repo", "old", time.Minute))
			require.NoError(t, s.Put(ctx, alice, "repo", "new", time.Minute))
			g, _ := s.Get(ctx, alice)
			assert.Equal(t, map[string]any{"repo": "new"}, g)
		}},
		{"a grant vanishes when its ttl ends while others stay", nil, func(t *testing.T, s grants.Store) {
			require.NoError(t, s.Put(ctx, alice, "short", 1, 300*time.Millisecond))
			require.NoError(t, s.Put(ctx, alice, "long", 2, time.Minute))
			assert.Eventually(t, func() bool {
				g, err := s.Get(ctx, alice)
				return err == nil && len(g) == 1 && g["long"] == float64(2)
			}, 10*time.Second, 50*time.Millisecond)
		}},
		{"delete removes one grant and deleting a missing one is fine", nil, func(t *testing.T, s grants.Store) {
			require.NoError(t, s.Put(ctx, alice, "a", 1, time.Minute))
			require.NoError(t, s.Put(ctx, alice, "b", 2, time.Minute))
			require.NoError(t, s.Delete(ctx, alice, "a"))
			require.NoError(t, s.Delete(ctx, alice, "never-there"))
			g, _ := s.Get(ctx, alice)
			assert.Equal(t, map[string]any{"b": float64(2)}, g)
		}},
		{"grants vanish with their sandbox", nil, func(t *testing.T, s grants.Store) {
			require.NoError(t, s.Put(ctx, alice, "a", 1, time.Minute))
			require.NoError(t, s.Put(ctx, bob, "a", 1, time.Minute))
			require.NoError(t, s.DeleteSandbox(ctx, alice))
			g, _ := s.Get(ctx, alice)
			assert.Empty(t, g)
			g, _ = s.Get(ctx, bob)
			assert.Len(t, g, 1, "other sandboxes keep theirs")
		}},
		{"a ttl over the maximum is refused", []grants.Option{grants.WithMaxTTL(time.Hour)}, func(t *testing.T, s grants.Store) {
			err := s.Put(ctx, alice, "a", 1, 2*time.Hour)
			require.ErrorIs(t, err, grants.ErrInvalid)
			assert.Contains(t, err.Error(), "ttl 2h0m0s is longer than the maximum of 1h0m0s")
		}},
		{"a zero ttl is refused", nil, func(t *testing.T, s grants.Store) {
			require.ErrorIs(t, s.Put(ctx, alice, "a", 1, 0), grants.ErrInvalid)
		}},
		{"an oversized value is refused", []grants.Option{grants.WithMaxValueSize(16)}, func(t *testing.T, s grants.Store) {
			err := s.Put(ctx, alice, "a", strings.Repeat("x", 20), time.Minute)
			require.ErrorIs(t, err, grants.ErrTooLarge)
			assert.Contains(t, err.Error(), "22 bytes, more than the maximum of 16")
		}},
		{"a name with odd characters is refused", nil, func(t *testing.T, s grants.Store) {
			require.ErrorIs(t, s.Put(ctx, alice, "a b", 1, time.Minute), grants.ErrInvalid)
			require.ErrorIs(t, s.Put(ctx, alice, "", 1, time.Minute), grants.ErrInvalid)
		}},
		{"a value that is not JSON is refused", nil, func(t *testing.T, s grants.Store) {
			require.ErrorIs(t, s.Put(ctx, alice, "a", func() {}, time.Minute), grants.ErrInvalid)
		}},
		{"a sandbox holds at most the maximum number of grants", []grants.Option{grants.WithMaxGrants(2)}, func(t *testing.T, s grants.Store) {
			require.NoError(t, s.Put(ctx, alice, "a", 1, time.Minute))
			require.NoError(t, s.Put(ctx, alice, "b", 1, time.Minute))
			require.NoError(t, s.Put(ctx, alice, "b", 2, time.Minute), "replacing is not adding")
			require.ErrorIs(t, s.Put(ctx, alice, "c", 1, time.Minute), grants.ErrTooLarge)
		}},
		{"expired grants do not count against the maximum", []grants.Option{grants.WithMaxGrants(1)}, func(t *testing.T, s grants.Store) {
			require.NoError(t, s.Put(ctx, alice, "a", 1, 200*time.Millisecond))
			assert.Eventually(t, func() bool { return s.Put(ctx, alice, "b", 1, time.Minute) == nil },
				10*time.Second, 50*time.Millisecond)
		}},
	}
	for name, newStore := range stores(t) {
		t.Run(name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.run(t, newStore(t)(tc.opts...))
				})
			}
		})
	}
}

func TestRedisReplicasSeeEachOthersGrants(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	replicaA := grants.NewRedis(srv.Client(t), "shared:")
	replicaB := grants.NewRedis(srv.Client(t), "shared:")

	require.NoError(t, replicaA.Put(ctx, alice, "repo", "acme/widgets", time.Minute))
	g, err := replicaB.Get(ctx, alice)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"repo": "acme/widgets"}, g)

	require.NoError(t, replicaB.DeleteSandbox(ctx, alice))
	g, err = replicaA.Get(ctx, alice)
	require.NoError(t, err)
	assert.Empty(t, g)
}

func TestRedisOutageIsBoundedAndReported(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := grants.NewRedis(srv.Client(t), "outage:")
	require.NoError(t, s.Put(ctx, alice, "repo", "x", time.Minute))

	srv.Pause()
	start := time.Now()
	_, err := s.Get(ctx, alice)
	assert.Error(t, err, "a hung Redis is an error, never an empty grant set taken for the truth")
	assert.Less(t, time.Since(start), 3*time.Second)
	srv.Resume()

	assert.Eventually(t, func() bool { g, err := s.Get(ctx, alice); return err == nil && g["repo"] == "x" },
		10*time.Second, 50*time.Millisecond)
}
