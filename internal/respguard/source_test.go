package respguard

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
)

// TestCurrentIsBuiltOnceForEveryAnswerInFlight: when the store's values change (a rotated
// value here, a token minted in production), the answers in flight that ask for the set at
// once get one new set, built once, holding the new value.
func TestCurrentIsBuiltOnceForEveryAnswerInFlight(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(file, []byte(secret), 0o600))
	store, err := credential.NewStore([]config.Credential{{Name: "key", File: file}}, os.Getenv, nil)
	require.NoError(t, err)
	src := NewSource(store)
	require.True(t, src.Current().Betrays([]byte(secret)))
	require.EqualValues(t, 1, src.builds.Load())

	rotated := "sk-ant-ROTATED-abcdef0123456789"
	require.NoError(t, os.WriteFile(file, []byte(rotated), 0o600))
	require.Equal(t, []string{"key"}, store.Refresh())
	start := make(chan struct{})
	sets := make([]*Needles, 64)
	var wg sync.WaitGroup
	for i := range sets {
		wg.Go(func() {
			<-start
			sets[i] = src.Current()
		})
	}
	close(start)
	wg.Wait()
	assert.EqualValues(t, 2, src.builds.Load(), "one build for the 64 answers")
	for _, n := range sets {
		assert.Same(t, sets[0], n)
	}
	assert.True(t, sets[0].Betrays([]byte(rotated)), "the new value")
	assert.True(t, sets[0].Betrays([]byte(secret)), "and the retired one, until it is forgotten")
}
