package policy_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Concurrent callers each get their own answer, evaluated and from the cache.
func TestConcurrentCallersEachGetTheirOwnAnswer(t *testing.T) {
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
}
