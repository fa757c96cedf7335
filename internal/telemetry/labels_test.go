package telemetry

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLabelSet(t *testing.T) {
	l := NewLabelSet(3, "ok", "not_found")
	tests := []struct {
		name, in, want string
	}{
		{"a known value passes", "not_found", "not_found"},
		{"a known value that is not code-shaped passes", "ok", "ok"},
		{"error text is other", "tools/call: invalid params: 'x'", Other},
		{"an upper-case word is other", "Model_Not_Allowed", Other},
		{"an empty value is other", "", Other},
		{"a word past the length bound is other", "a" + strings.Repeat("b", 64), Other},
		{"a policy's code passes", "model_not_allowed", "model_not_allowed"},
		{"it passes again", "model_not_allowed", "model_not_allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, l.Value(tt.in))
		})
	}
	t.Run("only the first max unknown codes pass, for good", func(t *testing.T) {
		assert.Equal(t, "second_code", l.Value("second_code"))
		assert.Equal(t, "third_code", l.Value("third_code"))
		assert.Equal(t, Other, l.Value("fourth_code"))
		assert.Equal(t, "second_code", l.Value("second_code"))
		assert.Equal(t, "not_found", l.Value("not_found"), "known values are not counted against max")
	})
}

// However many distinct values arrive, concurrently, the set of label values stays within
// known, max admitted codes and Other.
func TestLabelSetStaysBounded(t *testing.T) {
	l := NewLabelSet(16, "ok")
	var mu sync.Mutex
	values := map[string]bool{}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				v := l.Value(fmt.Sprintf("code_%d_%d", g, i))
				mu.Lock()
				values[v] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Len(t, values, 16+1, "16 admitted codes and other")
	assert.True(t, values[Other])
}
