// Package breaker is a circuit breaker for a dependency on the request path (Redis, an MCP
// upstream): after a run of consecutive failures it stops sending calls for a while, so that an
// outage costs each caller nothing instead of a timeout, then lets one probe through and closes on
// its success.
//
// The caller asks Allow before each call and reports the call's outcome with Success or Failure.
// Outcomes that say nothing about the dependency (the caller gave up, the dependency answered
// with an error of its own) should be reported with neither.
package breaker

import (
	"sync"
	"sync/atomic"
	"time"
)

// State is the breaker's state; its numeric value is what a gauge exports.
type State int32

// States. Closed lets every call through; Open lets none; HalfOpen has let one probe through
// and waits for its outcome.
const (
	Closed   State = 0
	Open     State = 1
	HalfOpen State = 2
)

func (s State) String() string {
	switch s {
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "closed"
}

// Config tunes a Breaker.
type Config struct {
	// Failures is the number of consecutive failures that opens the breaker (default 1).
	Failures int
	// OpenFor is how long the breaker stays open before a probe is let through (default 2s). A
	// probe that reports nothing within OpenFor is given up, and another one is let through.
	OpenFor time.Duration
}

// Breaker is safe for concurrent use. The zero value is not usable: call New.
type Breaker struct {
	cfg      Config
	now      func() time.Time
	onChange func(from, to State)

	state    atomic.Int32 // State; read without the lock on the fast path
	mu       sync.Mutex
	failures int       // consecutive, while closed
	since    time.Time // when the breaker opened, or when the probe was let through
}

// Option configures a Breaker.
type Option func(*Breaker)

// WithClock replaces time.Now, for tests.
func WithClock(now func() time.Time) Option { return func(b *Breaker) { b.now = now } }

// OnChange calls f after every state change (outside the breaker's lock; calls may race with
// later changes, so f should log or count, not decide).
func OnChange(f func(from, to State)) Option { return func(b *Breaker) { b.onChange = f } }

// New returns a closed Breaker.
func New(cfg Config, opts ...Option) *Breaker {
	if cfg.Failures <= 0 {
		cfg.Failures = 1
	}
	if cfg.OpenFor <= 0 {
		cfg.OpenFor = 2 * time.Second
	}
	b := &Breaker{cfg: cfg, now: time.Now}
	for _, o := range opts {
		o(b)
	}
	return b
}

// State returns the current state.
func (b *Breaker) State() State { return State(b.state.Load()) }

// Allow reports whether a call may go to the dependency now. While closed it always may (one
// atomic load); while open it may not, except for one probe once OpenFor has passed.
func (b *Breaker) Allow() bool {
	if b.State() == Closed {
		return true
	}
	b.mu.Lock()
	from := b.State()
	switch {
	case from == Closed:
		b.mu.Unlock()
		return true
	case b.now().Sub(b.since) < b.cfg.OpenFor:
		b.mu.Unlock()
		return false
	}
	b.since = b.now() // this call is the probe
	b.set(HalfOpen)
	b.mu.Unlock()
	b.changed(from, HalfOpen)
	return true
}

// Success reports a call the dependency answered: the breaker closes.
func (b *Breaker) Success() {
	if b.State() == Closed {
		b.mu.Lock()
		b.failures = 0
		b.mu.Unlock()
		return
	}
	b.mu.Lock()
	from := b.State()
	b.failures = 0
	b.set(Closed)
	b.mu.Unlock()
	b.changed(from, Closed)
}

// Failure reports a call the dependency failed (unreachable, timed out). Config.Failures of them
// in a row open a closed breaker; a failed probe opens it again for OpenFor. Failures reported
// while open (calls that started before it opened) do not extend the open period.
func (b *Breaker) Failure() {
	b.mu.Lock()
	from := b.State()
	switch from {
	case Open: // a call that started before the breaker opened: it stays open as it is
		b.mu.Unlock()
		return
	case Closed:
		b.failures++
		if b.failures < b.cfg.Failures {
			b.mu.Unlock()
			return
		}
	}
	b.failures = 0
	b.since = b.now()
	b.set(Open)
	b.mu.Unlock()
	b.changed(from, Open)
}

func (b *Breaker) set(s State) { b.state.Store(int32(s)) }

func (b *Breaker) changed(from, to State) {
	if from != to && b.onChange != nil {
		b.onChange(from, to)
	}
}
