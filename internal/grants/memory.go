package grants

import (
	"context"
	"sync"
	"time"
)

// Memory is a Store in this process. Expired grants are dropped when their sandbox is read and by a
// sweep of all sandboxes at most once a minute during Put, so no goroutine is needed and memory
// follows the live grants.
type Memory struct {
	limits limitsConfig
	now    func() time.Time

	mu        sync.Mutex
	sandboxes map[string]map[string]memGrant
	lastSweep time.Time
}

type memGrant struct {
	value   []byte
	expires time.Time
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory Store.
func NewMemory(opts ...Option) *Memory {
	return &Memory{limits: newLimitsConfig(opts), now: time.Now, sandboxes: map[string]map[string]memGrant{}}
}

// Put implements Store.
func (m *Memory) Put(_ context.Context, sandboxKey, name string, value any, ttl time.Duration) error {
	b, err := m.limits.checkPut(sandboxKey, name, value, ttl)
	if err != nil {
		return err
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if now.Sub(m.lastSweep) > time.Minute {
		m.lastSweep = now
		for k := range m.sandboxes {
			m.expire(k, now)
		}
	}
	g := m.expire(sandboxKey, now)
	if _, exists := g[name]; !exists && len(g) >= m.limits.maxGrants {
		return m.limits.tooMany(sandboxKey)
	}
	if g == nil {
		g = map[string]memGrant{}
		m.sandboxes[sandboxKey] = g
	}
	g[name] = memGrant{value: b, expires: now.Add(ttl)}
	return nil
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, sandboxKey string) (map[string]any, error) {
	out := map[string]any{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, g := range m.expire(sandboxKey, m.now()) {
		v, err := decode(name, g.value)
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// Delete implements Store.
func (m *Memory) Delete(_ context.Context, sandboxKey, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.sandboxes[sandboxKey], name)
	if len(m.sandboxes[sandboxKey]) == 0 {
		delete(m.sandboxes, sandboxKey)
	}
	return nil
}

// DeleteSandbox implements Store.
func (m *Memory) DeleteSandbox(_ context.Context, sandboxKey string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.sandboxes, sandboxKey)
	return nil
}

// expire drops the sandbox's expired grants and returns the rest. Caller holds mu.
func (m *Memory) expire(sandboxKey string, now time.Time) map[string]memGrant {
	g := m.sandboxes[sandboxKey]
	for name, e := range g {
		if !now.Before(e.expires) {
			delete(g, name)
		}
	}
	if g != nil && len(g) == 0 {
		delete(m.sandboxes, sandboxKey)
		return nil
	}
	return g
}

func (m *Memory) maxValueSize() int { return m.limits.maxValueSize }
