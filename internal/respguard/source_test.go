package respguard

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// fakeValues is a store of static values and minted tokens by sandbox, for the unit tests of
// Source.For alone (the acceptance tests mint at real servers: test/credentials).
type fakeValues struct {
	mu     sync.Mutex
	gen    uint64
	static []string
	bySbx  map[credential.SandboxKey][]string
}

func (f *fakeValues) Generation() uint64 { f.mu.Lock(); defer f.mu.Unlock(); return f.gen }
func (f *fakeValues) StaticValues() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.static)
}

func (f *fakeValues) SandboxValues(k credential.SandboxKey) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.bySbx[k])
}

func (f *fakeValues) Values() []string {
	out := f.StaticValues()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, vs := range f.bySbx {
		out = append(out, vs...)
	}
	return out
}
func (f *fakeValues) HasMinted() bool           { return true }
func (f *fakeValues) Get(string) (string, bool) { return "", false }
func (f *fakeValues) mint(k credential.SandboxKey, v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bySbx[k] = append(f.bySbx[k], v)
	f.gen++
}

func (f *fakeValues) end(k credential.SandboxKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.bySbx, k)
	f.gen++
}

// TestASandboxsSetOutlivesOtherRunsTokens: another run's token leaves a sandbox's set as it
// was (no rebuild at its next answer); its own new token makes a new set that holds it; the
// sets of sandboxes whose tokens are gone are dropped by the sweep.
func TestASandboxsSetOutlivesOtherRunsTokens(t *testing.T) {
	a, b := credential.SandboxKey{Namespace: "agents", Sandbox: "a"}, credential.SandboxKey{Namespace: "agents", Sandbox: "b"}
	f := &fakeValues{static: []string{secret}, bySbx: map[credential.SandboxKey][]string{}}
	src := &Source{store: f}
	f.mint(a, "tok-a-1-secretsecret")
	setA := src.For("agents", "a")
	require.True(t, setA.Betrays([]byte("tok-a-1-secretsecret")))
	require.False(t, setA.Betrays([]byte("tok-b-1-secretsecret")), "another run's token is not in a's set")

	f.mint(b, "tok-b-1-secretsecret")
	assert.Same(t, setA, src.For("agents", "a"), "b's token leaves a's set as it was")
	assert.True(t, src.For("agents", "b").Betrays([]byte("tok-b-1-secretsecret")))

	f.mint(a, "tok-a-2-secretsecret")
	setA2 := src.For("agents", "a")
	assert.NotSame(t, setA, setA2)
	assert.True(t, setA2.Betrays([]byte("tok-a-2-secretsecret")))
	assert.True(t, setA2.Betrays([]byte("tok-a-1-secretsecret")), "the replaced token, until it expires")
	assert.True(t, setA2.Betrays([]byte(secret)))

	f.end(b)
	for i := range sweepEvery {
		f.mint(credential.SandboxKey{Namespace: "agents", Sandbox: fmt.Sprint("c", i)}, fmt.Sprint("tok-c-", i, "-secretsecret"))
	}
	src.For("agents", "new") // a build: the sweep's turn
	_, kept := src.runs.m.Load(a)
	_, dropped := src.runs.m.Load(b)
	assert.True(t, kept, "a still holds tokens")
	assert.False(t, dropped, "b's tokens are gone, and so is its set")
}

// TestASlotKeepsItsRunsSet: a call holding a run's lease reaches the set of the run's sandbox
// through the lease's slot: the set For gives, without For's lookup, valid at the generation
// given with it; a new token of the sandbox changes the generation and gives the slot a new set
// that holds it. A call from another sandbox of the run (a claim's new sandbox, before the old
// one's end is seen) gets the set that holds the run's token, which For of its own sandbox
// does not.
func TestASlotKeepsItsRunsSet(t *testing.T) {
	a := credential.SandboxKey{Namespace: "agents", Sandbox: "a"}
	f := &fakeValues{static: []string{secret}, bySbx: map[credential.SandboxKey][]string{}}
	src := &Source{store: f}
	f.mint(a, "tok-a-1-secretsecret")
	g := &credential.GuardSlot{Sandbox: a}
	set, gen := src.ForSlot(g)
	require.Same(t, src.For("agents", "a"), set)
	require.Equal(t, src.Generation(), gen)
	require.True(t, set.Betrays([]byte("tok-a-1-secretsecret")))
	require.False(t, src.For("agents", "a-new").Betrays([]byte("tok-a-1-secretsecret")), "For knows the token for the run's first sandbox only")

	src.runs.m.Delete(a)
	again, _ := src.ForSlot(g)
	assert.Same(t, set, again, "the slot's set, with nothing to look up")

	f.mint(a, "tok-a-2-secretsecret")
	require.NotEqual(t, gen, src.Generation(), "the set taken before is stale")
	set2, gen2 := src.ForSlot(g)
	assert.Equal(t, src.Generation(), gen2)
	assert.NotSame(t, set, set2)
	assert.True(t, set2.Betrays([]byte("tok-a-2-secretsecret")))
	assert.True(t, set2.Betrays([]byte("tok-a-1-secretsecret")))
	assert.True(t, set2.Betrays([]byte(secret)))
	assert.Same(t, set2, src.For("agents", "a"), "For and the slot share the new set")
}
