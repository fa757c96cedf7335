package breaker

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// step is one thing that happens to a breaker, and what it should say afterwards.
type step struct {
	do      string // "allow", "success", "failure", or "wait" (advance the clock by wait)
	wait    time.Duration
	allowed bool   // for "allow": the answer wanted
	state   string // State.String() wanted afterwards; "" checks nothing
}

func TestBreaker(t *testing.T) {
	cfg := Config{Failures: 2, OpenFor: time.Second}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a closed breaker lets calls through and one failure does not open it", []step{
			{do: "allow", allowed: true, state: "closed"},
			{do: "failure", state: "closed"},
			{do: "allow", allowed: true, state: "closed"},
		}},
		{"a success between failures resets the count", []step{
			{do: "failure", state: "closed"},
			{do: "success", state: "closed"},
			{do: "failure", state: "closed"},
		}},
		{"consecutive failures open it and calls are refused while open", []step{
			{do: "failure", state: "closed"},
			{do: "failure", state: "open"},
			{do: "allow", allowed: false, state: "open"},
			{do: "wait", wait: 999 * time.Millisecond, state: "open"},
			{do: "allow", allowed: false, state: "open"},
		}},
		{"after open_for one probe goes through and the others wait for it", []step{
			{do: "failure"}, {do: "failure"},
			{do: "wait", wait: time.Second, state: "open"},
			{do: "allow", allowed: true, state: "half-open"},
			{do: "allow", allowed: false, state: "half-open"},
		}},
		{"a probe that succeeds closes it", []step{
			{do: "failure"}, {do: "failure"},
			{do: "wait", wait: time.Second},
			{do: "allow", allowed: true, state: "half-open"},
			{do: "success", state: "closed"},
			{do: "allow", allowed: true, state: "closed"},
			{do: "failure", state: "closed"}, // the count starts again from zero
		}},
		{"a probe that fails opens it again for open_for", []step{
			{do: "failure"}, {do: "failure"},
			{do: "wait", wait: time.Second},
			{do: "allow", allowed: true, state: "half-open"},
			{do: "failure", state: "open"},
			{do: "wait", wait: 500 * time.Millisecond},
			{do: "allow", allowed: false, state: "open"},
			{do: "wait", wait: 500 * time.Millisecond},
			{do: "allow", allowed: true, state: "half-open"},
		}},
		{"a probe that never reports is given up after open_for", []step{
			{do: "failure"}, {do: "failure"},
			{do: "wait", wait: time.Second},
			{do: "allow", allowed: true, state: "half-open"},
			{do: "wait", wait: time.Second},
			{do: "allow", allowed: true, state: "half-open"},
		}},
		{"late failures of calls started before it opened do not extend the open period", []step{
			{do: "failure"}, {do: "failure"},
			{do: "wait", wait: 900 * time.Millisecond},
			{do: "failure", state: "open"},
			{do: "wait", wait: 100 * time.Millisecond},
			{do: "allow", allowed: true, state: "half-open"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{t: time.Unix(1_800_000_000, 0)}
			b := New(cfg, WithClock(c.now))
			for i, s := range tc.steps {
				switch s.do {
				case "allow":
					assert.Equal(t, s.allowed, b.Allow(), "step %d: allow", i)
				case "success":
					b.Success()
				case "failure":
					b.Failure()
				case "wait":
					c.advance(s.wait)
				}
				if s.state != "" {
					assert.Equal(t, s.state, b.State().String(), "step %d (%s): state", i, s.do)
				}
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	b := New(Config{}, WithClock(c.now))
	b.Failure()
	assert.Equal(t, Open, b.State(), "one failure opens a breaker with the default threshold")
	c.advance(2*time.Second - time.Nanosecond)
	assert.False(t, b.Allow())
	c.advance(time.Nanosecond)
	assert.True(t, b.Allow(), "the default open period is 2s")
}

func TestOnChangeReportsEachTransition(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	var got []string
	b := New(Config{Failures: 1, OpenFor: time.Second}, WithClock(c.now), OnChange(func(from, to State) {
		got = append(got, from.String()+"->"+to.String())
	}))
	b.Success() // closed stays closed: no change
	b.Failure()
	b.Failure() // already open
	c.advance(time.Second)
	require.True(t, b.Allow())
	b.Failure()
	c.advance(time.Second)
	require.True(t, b.Allow())
	b.Success()
	assert.Equal(t, []string{"closed->open", "open->half-open", "half-open->open", "open->half-open", "half-open->closed"}, got)
}

// TestOneProbeUnderContention: many callers at once after open_for get exactly one probe.
func TestOneProbeUnderContention(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	b := New(Config{OpenFor: time.Second}, WithClock(c.now))
	b.Failure()
	c.advance(time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b.Allow() {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 1, allowed)
}
