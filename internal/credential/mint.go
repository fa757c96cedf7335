package credential

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/policy"
)

// provider mints and revokes the tokens of one credential.
type provider interface {
	kind() string
	// scope is what a token of run may reach (input.credential) and its fingerprint: a token
	// minted for another fingerprint is not used again.
	scope(run Run) (*policy.Credential, string)
	mint(ctx context.Context, run Run, scope *policy.Credential) (token string, expires time.Time, err error)
	// revoke ends token at the provider; errNoRevocation when it cannot.
	revoke(ctx context.Context, token string) error
}

// Bounds of the minting loop.
const (
	// expirySkew: a token this close to its expiry is not handed out any more.
	expirySkew = 5 * time.Second
	// minBackoff and maxBackoff bound how long a credential whose mint failed answers with
	// that failure before asking the provider again, doubling between them.
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
)

// minter keeps the minted tokens of every (credential, run): one mint for all the run's
// callers, a refresh before expiry by one caller while the others go on with the current
// token, and the tokens forgotten (and revoked where the provider can) when the run ends.
type minter struct {
	providers map[string]provider
	timeouts  map[string]time.Duration
	refresh   map[string]time.Duration
	now       func() time.Time
	events    *lifecycle

	mu      sync.RWMutex
	entries map[entryKey]*entry
	// dead are revoked or replaced tokens, kept in the scrub set until they expire.
	dead []deadLease
	// live is what the response guard scrubs: every token of every entry, and dead, in all and
	// by sandbox; gen counts its changes.
	live atomic.Pointer[liveTokens]
	gen  atomic.Uint64
}

// SandboxKey names a sandbox without building a string: the key of a response's needles.
type SandboxKey struct{ Namespace, Sandbox string }

// liveTokens are the minted tokens a response guard looks for.
type liveTokens struct {
	all   []string
	bySbx map[SandboxKey][]string
}

type deadLease struct {
	Lease
	sbx SandboxKey
}

type entryKey struct{ credential, run string }

// entry is one credential of one run.
type entry struct {
	name string
	run  Run
	cur  atomic.Pointer[held]
	// guard is the response guard's slot for the run's sandbox (Lease.Guard), in the line a
	// call's take has just read.
	guard GuardSlot

	mu          sync.Mutex
	inflight    *flight
	failures    int
	failedUntil time.Time
	failErr     error
	ended       bool
	retired     []Lease // replaced by a refresh, still valid: scrubbed until they expire
}

// held is an entry's current token.
type held struct {
	lease     Lease
	fp        string
	refreshAt time.Time
}

// flight is one mint in progress; done is closed when h or err is set.
type flight struct {
	fp   string
	done chan struct{}
	h    *held
	err  error
}

// Unavailable is a minted credential the call cannot have: its Reason is Sandgate's text, and
// RetryAfter says when the provider will be asked again (zero: at once).
type Unavailable struct {
	Credential, Provider, Reason string
	RetryAfter                   time.Duration
}

func (u *Unavailable) Error() string {
	return fmt.Sprintf("credential %q (%s) is unavailable: %s", u.Credential, u.Provider, u.Reason)
}

func newMinter(now func() time.Time, events *lifecycle) *minter {
	m := &minter{providers: map[string]provider{}, timeouts: map[string]time.Duration{}, refresh: map[string]time.Duration{},
		now: now, events: events, entries: map[entryKey]*entry{}}
	m.live.Store(&liveTokens{bySbx: map[SandboxKey][]string{}})
	return m
}

// take is the run's token of credential name with the fingerprint fp, minted if it has none.
func (m *minter) take(ctx context.Context, name string, run Run, scope *policy.Credential, fp string) (Lease, error) {
	p := m.providers[name]
	for range 3 {
		e := m.entry(name, run)
		now := m.now()
		if h := e.cur.Load(); h != nil && h.fp == fp && now.Before(h.lease.Expires.Add(-expirySkew)) {
			if !now.Before(h.refreshAt) {
				e.refreshOnce(m, p, scope, fp, now)
			}
			return h.lease, nil
		}
		f, err := e.join(m, p, scope, fp, now)
		if err != nil {
			return Lease{}, err
		}
		if f == nil {
			continue // the run ended meanwhile: a new entry
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return Lease{}, &Unavailable{Credential: name, Provider: p.kind(), Reason: "the call ended before the token was minted"}
		}
		if f.err != nil {
			return Lease{}, m.unavailable(name, p, f.err, m.backoff(e))
		}
		if f.fp == fp && f.h != nil {
			return f.h.lease, nil
		}
	}
	return Lease{}, &Unavailable{Credential: name, Provider: p.kind(), Reason: "the run's scope kept changing while minting"}
}

func (m *minter) unavailable(name string, p provider, err error, retry time.Duration) error {
	return &Unavailable{Credential: name, Provider: p.kind(), Reason: endpointReason("provider", err).Error(), RetryAfter: retry}
}

// backoff is how long e still answers with its last failure.
func (m *minter) backoff(e *entry) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return max(0, e.failedUntil.Sub(m.now()))
}

// entry is the (name, run) entry, made on first use.
func (m *minter) entry(name string, run Run) *entry {
	k := entryKey{name, run.Key}
	m.mu.RLock()
	e := m.entries[k]
	m.mu.RUnlock()
	if e != nil {
		return e
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e = m.entries[k]
	if e == nil {
		e = &entry{name: name, run: run}
		e.guard.Sandbox = SandboxKey{run.Namespace, run.Sandbox}
		m.entries[k] = e
	}
	return e
}

// join is the mint of fp in progress, started if there is none; nil (and no error) when the
// entry ended; the last failure while the backoff lasts.
func (e *entry) join(m *minter, p provider, scope *policy.Credential, fp string, now time.Time) (*flight, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return nil, nil
	}
	if f := e.inflight; f != nil {
		return f, nil // of another fingerprint: take loops after it
	}
	if h := e.cur.Load(); h != nil && h.fp == fp && now.Before(h.lease.Expires.Add(-expirySkew)) {
		// A mint ended between the caller's look at cur and this lock: its token serves the
		// caller too (a second mint for the same run here was a race of 1 in about 200 under
		// TestOneMintServesEveryConcurrentCallerOfTheRun).
		return &flight{fp: fp, done: closedDone, h: h}, nil
	}
	if now.Before(e.failedUntil) {
		return nil, m.unavailable(e.name, p, e.failErr, e.failedUntil.Sub(now))
	}
	return e.start(m, p, scope, fp), nil
}

// closedDone is the done of a flight that ended before it was joined.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// refreshOnce starts the refresh of a token past its refresh time, unless one runs or the
// last one failed recently; the caller goes on with the current token.
func (e *entry) refreshOnce(m *minter, p provider, scope *policy.Credential, fp string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.inflight == nil && !e.ended && !now.Before(e.failedUntil) {
		e.start(m, p, scope, fp)
	}
}

// start mints in the background, bounded by the provider's timeout and not by any caller's
// context: the token serves every caller of the run. The caller holds e.mu.
func (e *entry) start(m *minter, p provider, scope *policy.Credential, fp string) *flight {
	f := &flight{fp: fp, done: make(chan struct{})}
	e.inflight = f
	refresh := e.cur.Load() != nil
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), m.timeouts[e.name])
		defer cancel()
		t0 := m.now()
		tok, exp, err := p.mint(ctx, e.run, scope)
		m.minted(e, p, f, tok, exp, err, refresh, m.now().Sub(t0))
	}()
	return f
}

// minted ends the flight f with the provider's answer.
func (m *minter) minted(e *entry, p provider, f *flight, tok string, exp time.Time, err error, refresh bool, took time.Duration) {
	now := m.now()
	if err == nil && exp.Sub(now) <= 2*expirySkew {
		// A token that expires before it could serve a call would be minted again at every
		// call: a failure, with its backoff.
		err = reasonf("the token minted expires in %s, too soon to be used", exp.Sub(now).Round(time.Second))
	}
	e.mu.Lock()
	e.inflight = nil
	if err != nil {
		e.failures++
		e.failedUntil = now.Add(min(maxBackoff, minBackoff<<min(e.failures-1, 5)))
		e.failErr = err
		f.err = err
		e.mu.Unlock()
		m.events.minted(e, p.kind(), Lease{}, refresh, endpointReason("provider", err).Error(), took)
		close(f.done)
		return
	}
	lifetime := exp.Sub(now)
	h := &held{lease: Lease{Value: tok, ID: TokenID(tok), Provider: p.kind(), Expires: exp, Guard: &e.guard}, fp: f.fp,
		refreshAt: exp.Add(-min(m.refresh[e.name], lifetime/2))}
	old := e.cur.Swap(h)
	e.failures, e.failedUntil, e.failErr = 0, time.Time{}, nil
	ended := e.ended
	var rescoped *Lease
	if old != nil {
		if old.fp != f.fp {
			rescoped = &old.lease
		} else {
			e.retired = append(pruned(e.retired, now), old.lease)
		}
	}
	f.h = h
	e.mu.Unlock()
	m.changed()
	m.events.minted(e, p.kind(), h.lease, refresh, "", took)
	close(f.done)
	if ended {
		m.revoke(e, p, h.lease, "the run ended while its token was minted")
	}
	if rescoped != nil {
		m.revoke(e, p, *rescoped, "the run's scope changed (a grant was changed or deleted)")
	}
}

// forget ends every entry of the run or sandbox key: its tokens are revoked where the provider
// can, and no call gets them again. It returns how many tokens it revoked or forgot.
func (m *minter) forget(key, reason string) int {
	m.mu.Lock()
	var ended []*entry
	for k, e := range m.entries {
		if e.run.Key == key || e.run.SandboxKey == key {
			ended = append(ended, e)
			delete(m.entries, k)
		}
	}
	m.mu.Unlock()
	n := 0
	for _, e := range ended {
		e.mu.Lock()
		e.ended = true
		leases := pruned(e.retired, m.now())
		if h := e.cur.Swap(nil); h != nil {
			leases = append(leases, h.lease)
		}
		e.retired = nil
		e.mu.Unlock()
		for _, l := range leases {
			m.revoke(e, m.providers[e.name], l, reason)
			n++
		}
	}
	m.changed()
	return n
}

// revoke revokes l at the provider, in the background (bounded by the provider's timeout),
// and keeps it in the scrub set until it expires.
func (m *minter) revoke(e *entry, p provider, l Lease, reason string) {
	m.mu.Lock()
	m.dead = append(prunedDead(m.dead, m.now()), deadLease{l, SandboxKey{e.run.Namespace, e.run.Sandbox}})
	m.mu.Unlock()
	m.changed()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), m.timeouts[e.name])
		defer cancel()
		err := p.revoke(ctx, l.Value)
		m.events.revoked(e, l, reason, err)
	}()
}

// changed rebuilds the scrub set.
func (m *minter) changed() {
	m.mu.Lock()
	now := m.now()
	m.dead = prunedDead(m.dead, now)
	live := &liveTokens{bySbx: map[SandboxKey][]string{}}
	add := func(k SandboxKey, v string) {
		live.all = append(live.all, v)
		live.bySbx[k] = append(live.bySbx[k], v)
	}
	for _, l := range m.dead {
		add(l.sbx, l.Value)
	}
	entries := make([]*entry, 0, len(m.entries))
	for _, e := range m.entries {
		entries = append(entries, e)
	}
	m.mu.Unlock()
	for _, e := range entries {
		k := SandboxKey{e.run.Namespace, e.run.Sandbox}
		e.mu.Lock()
		if h := e.cur.Load(); h != nil {
			add(k, h.lease.Value)
		}
		for _, l := range e.retired {
			add(k, l.Value)
		}
		e.mu.Unlock()
	}
	m.live.Store(live)
	m.gen.Add(1)
}

func prunedDead(ls []deadLease, now time.Time) []deadLease {
	out := ls[:0]
	for _, l := range ls {
		if now.Before(l.Expires) {
			out = append(out, l)
		}
	}
	return out
}

// pruned is ls without the leases expired at now.
func pruned(ls []Lease, now time.Time) []Lease {
	out := ls[:0]
	for _, l := range ls {
		if now.Before(l.Expires) {
			out = append(out, l)
		}
	}
	return out
}

// leaseCount is how many runs hold a token of each credential (a gauge).
func (m *minter) leaseCount() map[string]int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := map[string]int64{}
	for name := range m.providers {
		out[name] = 0
	}
	for k, e := range m.entries {
		if e.cur.Load() != nil {
			out[k.credential]++
		}
	}
	return out
}
