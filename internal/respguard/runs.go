package respguard

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sandgate/sandgate/internal/credential"
)

// values is what a Source reads of a credential store (credential.Store).
type values interface {
	Generation() uint64
	Values() []string
	StaticValues() []string
	SandboxValues(credential.SandboxKey) []string
	HasMinted() bool
	Get(name string) (string, bool)
}

// runSet is the needle set For built for one sandbox, and the latest generation of the store
// at which the sandbox's values were still the set's.
type runSet struct {
	gen atomic.Uint64
	n   *Needles
}

// runSets are For's sets by sandbox. A set outlives changes elsewhere: a token minted for
// another run changes the store's generation but not this sandbox's values, which For then
// compares and keeps. (Rebuilt at every mint of any run, a sandbox's set cost its next answer
// 22 µs, BenchmarkBuild/run: a fifth of the route's whole request.) Sets of sandboxes left
// without a value are dropped every sweepEvery generations.
type runSets struct {
	m       sync.Map // credential.SandboxKey → *runSet
	sweptAt atomic.Uint64
}

const sweepEvery = 256

// For is the needle set of an answer to the sandbox ns/sandbox: every static value and the
// live tokens minted for that sandbox's runs. Its upstream was sent no other run's token, so
// another run's cannot be in the answer; scanning for every run's token would cost each
// answer in proportion to the number of runs. Without minted credentials it is Current.
func (s *Source) For(ns, sandbox string) *Needles {
	if !s.store.HasMinted() {
		return s.Current()
	}
	gen := s.store.Generation()
	k := credential.SandboxKey{Namespace: ns, Sandbox: sandbox}
	e, _ := s.runs.m.Load(k)
	rs, _ := e.(*runSet)
	if rs != nil && rs.gen.Load() == gen {
		return rs.n
	}
	// The values are read after the generation: they are at least as new as gen says.
	vals := append(s.store.StaticValues(), s.store.SandboxValues(k)...)
	slices.Sort(vals)
	if rs != nil && slices.Equal(rs.n.values, vals) {
		rs.gen.Store(gen)
		return rs.n
	}
	rs = &runSet{n: Build(vals, s.rendered())}
	rs.gen.Store(gen)
	s.runs.m.Store(k, rs)
	s.sweep(gen)
	return rs.n
}

// sweep drops the sets of sandboxes without a minted value (their runs ended and their tokens
// expired), once every sweepEvery generations.
func (s *Source) sweep(gen uint64) {
	last := s.runs.sweptAt.Load()
	if gen-last < sweepEvery || !s.runs.sweptAt.CompareAndSwap(last, gen) {
		return
	}
	s.runs.m.Range(func(key, _ any) bool {
		if len(s.store.SandboxValues(key.(credential.SandboxKey))) == 0 {
			s.runs.m.Delete(key)
		}
		return true
	})
}
