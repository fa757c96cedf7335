package credential

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/policy"
)

// fakeProvider is a provider for the unit tests of the minting loop alone: the acceptance
// tests mint at real servers (test/credentials). gate, when set, holds each mint until closed.
type fakeProvider struct {
	mu       sync.Mutex
	mints    atomic.Int64
	fail     error
	lifetime time.Duration
	now      func() time.Time
	gate     chan struct{}
	revoked  []string
	revokeCh chan string
}

func (p *fakeProvider) kind() string { return "fake" }
func (p *fakeProvider) scope(run Run) (*policy.Credential, string) {
	repos, _ := run.Grants["repos"].(string)
	return &policy.Credential{Name: "c", Provider: "fake", Repositories: []string{repos}}, repos
}

func (p *fakeProvider) mint(ctx context.Context, run Run, _ *policy.Credential) (string, time.Time, error) {
	n := p.mints.Add(1)
	if p.gate != nil {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return "", time.Time{}, ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		return "", time.Time{}, p.fail
	}
	return fmt.Sprintf("tok-%s-%d-secretsecret", run.Key, n), p.now().Add(p.lifetime), nil
}

func (p *fakeProvider) revoke(_ context.Context, token string) error {
	p.mu.Lock()
	p.revoked = append(p.revoked, token)
	p.mu.Unlock()
	if p.revokeCh != nil {
		p.revokeCh <- token
	}
	return nil
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type events struct {
	mu  sync.Mutex
	evs []Event
}

func (e *events) CredentialEvent(ev Event) { e.mu.Lock(); e.evs = append(e.evs, ev); e.mu.Unlock() }
func (e *events) of(k EventKind) []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Event
	for _, ev := range e.evs {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

func newTestMinter(t *testing.T) (*Store, *fakeProvider, *clock, *events) {
	c := &clock{t: time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)}
	p := &fakeProvider{lifetime: time.Hour, now: c.now}
	ev := &events{}
	lc, err := newLifecycle(ev, nil, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	m := newMinter(c.now, lc)
	m.providers["c"], m.timeouts["c"], m.refresh["c"] = p, 5*time.Second, time.Minute
	s := FromValues(map[string]string{"static": "static-value"})
	s.minter = m
	return s, p, c, ev
}

func runOf(key, repos string) Run {
	return Run{Key: key, SandboxKey: key, Namespace: "agents", Sandbox: key, Grants: map[string]any{"repos": repos}}
}

func take(s *Store, run Run) (Lease, error) {
	sc, fp := s.ScopeOf("c", run)
	return s.Take(context.Background(), "c", run, sc, fp)
}

func TestOneMintServesEveryConcurrentCallerOfTheRun(t *testing.T) {
	s, p, _, ev := newTestMinter(t)
	p.gate = make(chan struct{})
	run := runOf("agents/claims/a", "acme/widgets")
	var wg sync.WaitGroup
	got := make([]string, 100)
	for i := range got {
		wg.Go(func() {
			l, err := take(s, run)
			assert.NoError(t, err)
			got[i] = l.Value
		})
	}
	require.Eventually(t, func() bool { return p.mints.Load() == 1 }, 5*time.Second, time.Millisecond)
	close(p.gate)
	wg.Wait()
	assert.Equal(t, int64(1), p.mints.Load(), "one mint for 100 callers")
	for _, v := range got {
		assert.Equal(t, got[0], v)
	}
	assert.Len(t, ev.of(EventMint), 1)
	assert.Contains(t, s.Values(), got[0], "the response guard scrubs the minted token")
}

func TestRefreshBeforeExpiryOnceWhileCallersKeepTheCurrentToken(t *testing.T) {
	s, p, c, ev := newTestMinter(t)
	run := runOf("agents/claims/a", "acme/widgets")
	first, err := take(s, run)
	require.NoError(t, err)
	c.add(time.Hour - 30*time.Second) // past refresh_before (1m), before expiry
	p.gate = make(chan struct{})
	for range 100 {
		l, err := take(s, run)
		require.NoError(t, err)
		assert.Equal(t, first.Value, l.Value, "callers never wait for a refresh")
	}
	close(p.gate)
	require.Eventually(t, func() bool { return len(ev.of(EventRefresh)) == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, int64(2), p.mints.Load(), "one refresh for 100 calls")
	l, err := take(s, run)
	require.NoError(t, err)
	assert.NotEqual(t, first.Value, l.Value)
	assert.Contains(t, s.Values(), first.Value, "the replaced token is live until it expires: still scrubbed")
}

func TestAProviderFailureRefusesWithItsReasonBacksOffAndRecovers(t *testing.T) {
	s, p, c, ev := newTestMinter(t)
	p.fail = reasonf("token endpoint unreachable")
	run := runOf("agents/claims/a", "acme/widgets")
	_, err := take(s, run)
	u, ok := IsUnavailable(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, "token endpoint unreachable", u.Reason)
	_, err = take(s, run)
	u, _ = IsUnavailable(err)
	require.NotNil(t, u)
	assert.Positive(t, u.RetryAfter)
	assert.Equal(t, int64(1), p.mints.Load(), "the provider is not asked again during the backoff")
	require.Len(t, ev.of(EventMint), 1)
	assert.True(t, ev.of(EventMint)[0].Failed)

	p.mu.Lock()
	p.fail = nil
	p.mu.Unlock()
	c.add(minBackoff)
	l, err := take(s, run)
	require.NoError(t, err, "recovers once the backoff is over")
	assert.NotEmpty(t, l.Value)
}

func TestForgettingARunRevokesItsTokenWhichNoCallGetsAgain(t *testing.T) {
	s, p, _, ev := newTestMinter(t)
	p.revokeCh = make(chan string, 4)
	a := runOf("agents/claims/a", "acme/widgets")
	b := runOf("agents/claims/b", "acme/widgets")
	la, err := take(s, a)
	require.NoError(t, err)
	lb, err := take(s, b)
	require.NoError(t, err)
	assert.NotEqual(t, la.Value, lb.Value, "each run has its own token")

	assert.Equal(t, 1, s.Forget(a.Key, "its claim was deleted"))
	assert.Equal(t, la.Value, <-p.revokeCh)
	again, err := take(s, a)
	require.NoError(t, err)
	assert.NotEqual(t, la.Value, again.Value, "a new run of the same key gets a new token")
	still, err := take(s, b)
	require.NoError(t, err)
	assert.Equal(t, lb.Value, still.Value, "another run keeps its token")
	require.Eventually(t, func() bool { return len(ev.of(EventRevoke)) == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, "its claim was deleted", ev.of(EventRevoke)[0].Reason)
	assert.Equal(t, la.ID, ev.of(EventRevoke)[0].TokenID)
}

func TestASandboxGoneEndsTheRunsOfItsClaim(t *testing.T) {
	s, p, _, _ := newTestMinter(t)
	p.revokeCh = make(chan string, 4)
	run := runOf("agents/claims/a", "acme/widgets")
	run.SandboxKey = "agents/box-1"
	l, err := take(s, run)
	require.NoError(t, err)
	assert.Equal(t, 1, s.Forget("agents/box-1", "its sandbox was deleted"))
	assert.Equal(t, l.Value, <-p.revokeCh)
}

func TestAChangedScopeMintsAnewAndRevokesTheOldToken(t *testing.T) {
	s, p, _, _ := newTestMinter(t)
	p.revokeCh = make(chan string, 4)
	wide, err := take(s, runOf("agents/claims/a", "acme/widgets,acme/other"))
	require.NoError(t, err)
	narrow, err := take(s, runOf("agents/claims/a", "acme/widgets"))
	require.NoError(t, err)
	assert.NotEqual(t, wide.Value, narrow.Value)
	assert.Equal(t, wide.Value, <-p.revokeCh, "the wider token is revoked")
}

func TestTheGenerationChangesWithTheMintedTokens(t *testing.T) {
	s, _, _, _ := newTestMinter(t)
	g0 := s.Generation()
	l, err := take(s, runOf("agents/claims/a", "acme/widgets"))
	require.NoError(t, err)
	assert.NotEqual(t, g0, s.Generation())
	assert.True(t, slices.Contains(s.Values(), l.Value))
	assert.True(t, slices.Contains(s.Values(), "static-value"), "static values stay")
}

func TestAnUnknownCallerGetsNoMintedToken(t *testing.T) {
	s, p, _, _ := newTestMinter(t)
	_, err := s.Take(context.Background(), "c", Run{Key: "anonymous"}, &policy.Credential{}, "")
	_, ok := IsUnavailable(err)
	assert.True(t, ok)
	assert.Zero(t, p.mints.Load())
}

func TestReasonsNeverCarryTheEndpointsText(t *testing.T) {
	err := endpointReason("token endpoint", errors.New("dial tcp: secret-bytes-from-upstream"))
	assert.NotContains(t, err.Error(), "secret-bytes")
}

func TestATokenThatExpiresAtOnceIsAFailureNotAMintPerCall(t *testing.T) {
	s, p, _, _ := newTestMinter(t)
	p.lifetime = time.Second
	run := runOf("agents/claims/a", "acme/widgets")
	for range 5 {
		_, err := take(s, run)
		u, ok := IsUnavailable(err)
		require.True(t, ok)
		assert.Contains(t, u.Reason, "too soon to be used")
	}
	assert.Equal(t, int64(1), p.mints.Load(), "the backoff holds: one request to the provider")
}

// TestALeaseCarriesItsRunsGuardSlot: every lease of a run carries the one slot the response
// guard keeps the run's sandbox's needles in, named for the run's first sandbox; another run's
// leases carry another.
func TestALeaseCarriesItsRunsGuardSlot(t *testing.T) {
	s, _, c, _ := newTestMinter(t)
	runA, runB := runOf("agents/claims/a", "acme/widgets"), runOf("agents/claims/b", "acme/widgets")
	la, err := take(s, runA)
	require.NoError(t, err)
	lb, err := take(s, runB)
	require.NoError(t, err)
	require.NotNil(t, la.Guard)
	assert.Equal(t, SandboxKey{Namespace: "agents", Sandbox: "agents/claims/a"}, la.Guard.Sandbox)
	assert.NotSame(t, la.Guard, lb.Guard)

	c.add(2 * time.Hour) // past expiry: a new token of the same run
	la2, err := take(s, runA)
	require.NoError(t, err)
	require.NotEqual(t, la.Value, la2.Value)
	assert.Same(t, la.Guard, la2.Guard, "one slot for the run's every token")
}
