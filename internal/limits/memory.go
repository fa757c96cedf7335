package limits

import (
	"context"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/config"
)

// store is the counter storage behind a Limiter. Each method is one atomic step over all scopes of
// the request: check every limit, then count in every scope, or count nothing.
type store interface {
	take(ctx context.Context, r request) (result, error)
	addTokens(ctx context.Context, r request, n int64) (result, error)
	acquire(ctx context.Context, r request, leaseID string) (result, error)
	release(ctx context.Context, r request, leaseID string) error
	usage(ctx context.Context, r request) (result, error)
}

// NewMemory returns a Limiter whose counters live in this process: correct for one replica.
func NewMemory(cfg config.Limits, opts ...Option) *Limiter {
	return newLimiter(&memoryStore{counters: map[string]memCounter{}, leases: map[string]map[string]time.Time{}}, "", cfg, opts)
}

// memoryStore mirrors the Redis scripts with a mutex. Expired counters and leases are dropped on
// access and by a sweep at most once a minute, so memory follows the number of active sandboxes.
type memoryStore struct {
	mu        sync.Mutex
	counters  map[string]memCounter
	leases    map[string]map[string]time.Time // key → lease ID → expiry
	lastSweep time.Time
}

type memCounter struct {
	n       int64
	expires time.Time
}

func (m *memoryStore) get(key string, now time.Time) int64 {
	c, ok := m.counters[key]
	if !ok || !now.Before(c.expires) {
		return 0
	}
	return c.n
}

func (m *memoryStore) incr(key string, by int64, now time.Time, ttl time.Duration) int64 {
	c, ok := m.counters[key]
	if !ok || !now.Before(c.expires) {
		c = memCounter{expires: now.Add(ttl)}
	}
	c.n += by
	m.counters[key] = c
	return c.n
}

func (m *memoryStore) live(key string, now time.Time) int64 {
	set := m.leases[key]
	for id, exp := range set {
		if !now.Before(exp) {
			delete(set, id)
		}
	}
	if len(set) == 0 {
		delete(m.leases, key)
	}
	return int64(len(set))
}

func (m *memoryStore) read(r request) result {
	var res result
	for i, s := range r.scopes {
		res.counts[i] = counts{m.get(s.rpmKey, r.now), m.get(s.tokKey, r.now), m.live(s.leaseKey, r.now)}
	}
	return res
}

// lock locks the store (the caller unlocks m.mu), first sweeping expired counters and leases
// when the last sweep is more than a minute old.
func (m *memoryStore) lock(now time.Time) {
	m.mu.Lock()
	if now.Sub(m.lastSweep) > time.Minute {
		m.lastSweep = now
		for k, c := range m.counters {
			if !now.Before(c.expires) {
				delete(m.counters, k)
			}
		}
		for k := range m.leases {
			m.live(k, now)
		}
	}
}

func (m *memoryStore) take(_ context.Context, r request) (result, error) {
	m.lock(r.now)
	defer m.mu.Unlock()
	res := m.read(r)
	for i, s := range r.scopes {
		c := res.counts[i]
		switch {
		case s.limits.TokensPerDay > 0 && c.tokens >= s.limits.TokensPerDay:
			res.refused, res.scope = limitTokens, i
		case s.limits.RequestsPerMinute > 0 && c.requests >= s.limits.RequestsPerMinute:
			res.refused, res.scope = limitRequests, i
		default:
			continue
		}
		return res, nil
	}
	for i, s := range r.scopes {
		res.counts[i].requests = m.incr(s.rpmKey, 1, r.now, rpmTTL)
	}
	return res, nil
}

func (m *memoryStore) addTokens(_ context.Context, r request, n int64) (result, error) {
	m.lock(r.now)
	defer m.mu.Unlock()
	res := m.read(r)
	for i, s := range r.scopes {
		res.counts[i].tokens = m.incr(s.tokKey, n, r.now, tokTTL)
	}
	for i, s := range r.scopes {
		if s.limits.TokensPerDay > 0 && res.counts[i].tokens >= s.limits.TokensPerDay {
			res.refused, res.scope = limitTokens, i
			break
		}
	}
	return res, nil
}

func (m *memoryStore) acquire(_ context.Context, r request, id string) (result, error) {
	m.lock(r.now)
	defer m.mu.Unlock()
	res := m.read(r)
	for i, s := range r.scopes {
		if s.limits.ConcurrentToolCalls > 0 && res.counts[i].concurrent >= s.limits.ConcurrentToolCalls {
			res.refused, res.scope = limitConcurrency, i
			return res, nil
		}
	}
	for i, s := range r.scopes {
		set := m.leases[s.leaseKey]
		if set == nil {
			set = map[string]time.Time{}
			m.leases[s.leaseKey] = set
		}
		set[id] = r.now.Add(r.lease)
		res.counts[i].concurrent++
	}
	return res, nil
}

func (m *memoryStore) release(_ context.Context, r request, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range r.scopes {
		delete(m.leases[s.leaseKey], id)
	}
	return nil
}

func (m *memoryStore) usage(_ context.Context, r request) (result, error) {
	m.lock(r.now)
	defer m.mu.Unlock()
	return m.read(r), nil
}
