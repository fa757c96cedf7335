package breaker

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestBreaker(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	var changes []string
	b := New(Config{Failures: 3, OpenFor: 10 * time.Second}, c.now, func(from, to State) {
		changes = append(changes, from.String()+">"+to.String())
	})
	fail := func() {
		tk, err := b.Allow()
		require.NoError(t, err)
		b.Done(tk, false)
	}

	t.Run("fewer consecutive failures than the threshold keep it closed", func(t *testing.T) {
		fail()
		fail()
		tk, err := b.Allow()
		require.NoError(t, err)
		b.Done(tk, true) // a success resets the run
		fail()
		fail()
		assert.Equal(t, Closed, b.State())
	})
	t.Run("the threshold opens it and calls are refused at once", func(t *testing.T) {
		fail()
		assert.Equal(t, Open, b.State())
		_, err := b.Allow()
		assert.ErrorIs(t, err, ErrOpen)
		var oe *OpenError
		require.True(t, errors.As(err, &oe))
		assert.Equal(t, 10*time.Second, oe.Left)
	})
	t.Run("after the open period one probe goes through, the others are refused", func(t *testing.T) {
		c.t = c.t.Add(10 * time.Second)
		probe, err := b.Allow()
		require.NoError(t, err)
		assert.Equal(t, HalfOpen, b.State())
		_, err = b.Allow()
		assert.ErrorIs(t, err, ErrOpen)
		b.Done(probe, false)
		assert.Equal(t, Open, b.State(), "a failed probe opens it again")
		_, err = b.Allow()
		assert.ErrorIs(t, err, ErrOpen)
	})
	t.Run("a successful probe closes it", func(t *testing.T) {
		c.t = c.t.Add(10 * time.Second)
		probe, err := b.Allow()
		require.NoError(t, err)
		b.Done(probe, true)
		assert.Equal(t, Closed, b.State())
		_, err = b.Allow()
		assert.NoError(t, err)
	})
	t.Run("outcomes of calls allowed before a transition do not count", func(t *testing.T) {
		stale := make([]Ticket, 0, 4)
		for range 4 {
			tk, err := b.Allow()
			require.NoError(t, err)
			stale = append(stale, tk)
		}
		for _, tk := range stale[:3] {
			b.Done(tk, false)
		}
		require.Equal(t, Open, b.State())
		b.Done(stale[3], true) // a late success of a call allowed before it opened
		assert.Equal(t, Open, b.State())
	})
	t.Run("an abandoned probe lets the next call probe at once", func(t *testing.T) {
		c.t = c.t.Add(10 * time.Second)
		probe, err := b.Allow()
		require.NoError(t, err)
		b.Abandon(probe)
		assert.Equal(t, Open, b.State())
		next, err := b.Allow()
		require.NoError(t, err, "no new open period")
		b.Done(next, true)
		assert.Equal(t, Closed, b.State())
		tk, _ := b.Allow()
		b.Abandon(tk) // not a probe: nothing changes
		assert.Equal(t, Closed, b.State())
	})
	assert.Equal(t, []string{"closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>closed", "closed>open",
		"open>half-open", "half-open>open", "open>half-open", "half-open>closed"}, changes)
}

func TestDefaults(t *testing.T) {
	b := New(Config{}, nil, nil)
	for range DefaultFailures - 1 {
		tk, _ := b.Allow()
		b.Done(tk, false)
	}
	assert.Equal(t, Closed, b.State())
	tk, _ := b.Allow()
	b.Done(tk, false)
	assert.Equal(t, Open, b.State())
}
