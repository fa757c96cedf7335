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
	return s.forSandbox(credential.SandboxKey{Namespace: ns, Sandbox: sandbox}, s.store.Generation()).n
}

// ForSlot is For of the sandbox of the run whose lease gave g (credential.Lease.Guard), kept
// in g: the set of an answer to a call that took a minted token, reached without looking it
// up among every sandbox's (that lookup, a few cache misses, was a quarter of what the bench's
// minted credential added to the route's CPU per request, 0.5%). Its tokens hold the one the
// call sent, also when the call's sandbox is not the run's first (a claim's new sandbox before
// the old one's end is seen).
//
// The set stays the sandbox's while the store's generation is the one returned with it
// (Generation): a caller that takes it when its request leaves and answers later reads no line
// of the slot then.
func (s *Source) ForSlot(g *credential.GuardSlot) (*Needles, uint64) {
	gen := s.store.Generation()
	if rs, _ := g.Load().(*runSet); rs != nil && rs.gen.Load() == gen {
		return rs.n, gen
	}
	rs := s.forSandbox(g.Sandbox, gen)
	g.Store(rs)
	return rs.n, gen
}

// Generation is the store's generation: what Current, For and ForSlot give changes only with it.
func (s *Source) Generation() uint64 { return s.store.Generation() }

// forSandbox is the set of sandbox k at the store's generation gen, built if its values
// changed since its last.
func (s *Source) forSandbox(k credential.SandboxKey, gen uint64) *runSet {
	e, _ := s.runs.m.Load(k)
	rs, _ := e.(*runSet)
	if rs != nil && rs.gen.Load() == gen {
		return rs
	}
	// The values are read after the generation: they are at least as new as gen says.
	vals := append(s.store.StaticValues(), s.store.SandboxValues(k)...)
	slices.Sort(vals)
	if rs != nil && slices.Equal(rs.n.values, vals) {
		rs.gen.Store(gen)
		return rs
	}
	rs = &runSet{n: Build(vals, s.rendered())}
	rs.gen.Store(gen)
	s.runs.m.Store(k, rs)
	s.sweep(gen)
	return rs
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
