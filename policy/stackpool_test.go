package policy_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/policy"
)

func TestDecisionsOnWorkers(t *testing.T) {
	t.Run("concurrent callers each get their own answer", func(t *testing.T) {
		e, _ := newEngine(t, map[string]string{"p.rego": allowEcho})
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tool, want := "echo", true
				if i%2 == 1 {
					tool, want = "rm", false
				}
				for range 50 {
					assert.Equal(t, want, e.Decide(context.Background(), callInput(tool)).Allow)
				}
			}()
		}
		wg.Wait()
	})
	t.Run("decisions go on after the engine's context ends", func(t *testing.T) {
		dir := t.TempDir()
		writePolicy(t, dir, "p.rego", allowEcho)
		ctx, cancel := context.WithCancel(context.Background())
		e, err := policy.New(ctx, dir)
		require.NoError(t, err)
		cancel()
		for range 20 {
			assert.True(t, e.Decide(context.Background(), callInput("echo")).Allow)
		}
	})
}
