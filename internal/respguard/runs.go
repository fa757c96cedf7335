package respguard

import (
	"slices"
	"sync"

	"github.com/sandgate/sandgate/internal/credential"
)

// runNeedles are the needle sets For built at one generation of the store, by sandbox: a
// change anywhere (a token minted, replaced or ended, a rotated value) starts a new set, so
// that a sandbox's set is rebuilt at its next response and a gone sandbox's is dropped.
type runNeedles struct {
	gen uint64
	m   sync.Map // credential.SandboxKey → *Needles
}

// For is the needle set of an answer to the sandbox ns/sandbox: every static value and the
// live tokens minted for that sandbox's runs. Its upstream was sent no other run's token, so
// another run's cannot be in the answer; scanning for every run's token would cost each
// answer in proportion to the number of runs. Without minted credentials it is Current.
func (s *Source) For(ns, sandbox string) *Needles {
	if !s.store.HasMinted() {
		return s.Current()
	}
	gen := s.store.Generation()
	rn := s.runs.Load()
	if rn == nil || rn.gen != gen {
		rn = &runNeedles{gen: gen}
		s.runs.Store(rn)
	}
	k := credential.SandboxKey{Namespace: ns, Sandbox: sandbox}
	if n, ok := rn.m.Load(k); ok {
		return n.(*Needles)
	}
	vals := append(s.store.StaticValues(), s.store.SandboxValues(k)...)
	slices.Sort(vals)
	n := Build(vals, s.rendered())
	n.gen = gen
	rn.m.Store(k, n)
	return n
}
