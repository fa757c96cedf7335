// Package breaker is a circuit breaker: after a run of consecutive failures a dependency is
// left alone for a while (open), so that callers fail at once instead of each paying a
// timeout; then one probe call (half-open) decides whether it is back (closed) or not (open
// again).
//
// What counts as a failure is the caller's choice: for an MCP upstream, a transport failure
// or a timeout, never an error the dependency answered.
package breaker

import (
	"errors"
	"sync"
	"time"
)

// State is where a breaker is.
type State int

// States. The numbers are what the state metrics report.
const (
	Closed   State = 0 // calls go through
	HalfOpen State = 1 // one probe call is in flight; the others are refused
	Open     State = 2 // calls are refused until the open period ends
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	default:
		return "open"
	}
}

// ErrOpen is what Allow returns while the breaker refuses calls.
var ErrOpen = errors.New("circuit breaker open")

// Config sets a breaker. Zero values take the defaults.
type Config struct {
	// Failures is how many consecutive failures open the breaker (default 5).
	Failures int
	// OpenFor is how long the breaker stays open before it lets one probe through (default 10s).
	OpenFor time.Duration
}

// Defaults.
const (
	DefaultFailures = 5
	DefaultOpenFor  = 10 * time.Second
)

// Breaker is one dependency's breaker. It is safe for concurrent use.
type Breaker struct {
	cfg Config
	now func() time.Time

	mu       sync.Mutex
	state    State
	failures int
	openedAt time.Time
	gen      uint64 // moves on each transition, so that a stale outcome is ignored
	onChange func(from, to State)
}

// New returns a closed breaker. now is the clock (nil: time.Now); onChange, if set, is called
// on every transition, outside the breaker's lock.
func New(cfg Config, now func() time.Time, onChange func(from, to State)) *Breaker {
	if cfg.Failures <= 0 {
		cfg.Failures = DefaultFailures
	}
	if cfg.OpenFor <= 0 {
		cfg.OpenFor = DefaultOpenFor
	}
	if now == nil {
		now = time.Now
	}
	return &Breaker{cfg: cfg, now: now, onChange: onChange}
}

// Ticket is one allowed call; report its outcome with Done.
type Ticket struct {
	gen   uint64
	probe bool
}

// Allow asks whether a call may go ahead. While open it returns ErrOpen (wrapped with how
// long it stays open); when the open period is over the first caller gets the probe and the
// others ErrOpen until the probe's outcome is known.
func (b *Breaker) Allow() (Ticket, error) {
	b.mu.Lock()
	switch b.state {
	case Closed:
		t := Ticket{gen: b.gen}
		b.mu.Unlock()
		return t, nil
	case Open:
		if left := b.cfg.OpenFor - b.now().Sub(b.openedAt); left > 0 {
			b.mu.Unlock()
			return Ticket{}, &OpenError{Left: left}
		}
		from := b.transition(HalfOpen)
		t := Ticket{gen: b.gen, probe: true}
		b.mu.Unlock()
		b.changed(from, HalfOpen)
		return t, nil
	default: // HalfOpen: the probe is in flight
		b.mu.Unlock()
		return Ticket{}, &OpenError{}
	}
}

// Done reports the outcome of an allowed call: ok is false for a failure. Outcomes of calls
// allowed before the last transition only count when they are failures in the closed state
// they were allowed in, or the probe's own.
func (b *Breaker) Done(t Ticket, ok bool) {
	b.mu.Lock()
	if t.gen != b.gen {
		b.mu.Unlock()
		return
	}
	from, to := b.state, b.state
	switch {
	case t.probe && ok:
		b.failures = 0
		to = Closed
	case t.probe:
		to = Open
	case ok:
		b.failures = 0
	default:
		b.failures++
		if b.failures >= b.cfg.Failures {
			to = Open
		}
	}
	if to != from {
		b.transition(to)
	}
	b.mu.Unlock()
	if to != from {
		b.changed(from, to)
	}
}

// Abandon releases a ticket whose call ended without telling anything about the dependency
// (the caller gave up, or the call never reached it). An abandoned probe leaves the breaker
// open with its period over, so that the next call probes.
func (b *Breaker) Abandon(t Ticket) {
	b.mu.Lock()
	if !t.probe || t.gen != b.gen {
		b.mu.Unlock()
		return
	}
	b.transition(Open)
	b.openedAt = b.now().Add(-b.cfg.OpenFor)
	b.mu.Unlock()
	b.changed(HalfOpen, Open)
}

// State is the breaker's state now (an open breaker whose period is over still reads open
// until a call probes it).
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// transition moves to s; the caller holds mu and calls changed after unlocking.
func (b *Breaker) transition(s State) State {
	from := b.state
	b.state = s
	b.gen++
	if s == Open {
		b.openedAt = b.now()
	}
	if s == Closed {
		b.failures = 0
	}
	return from
}

func (b *Breaker) changed(from, to State) {
	if b.onChange != nil {
		b.onChange(from, to)
	}
}

// OpenError is ErrOpen with how long the breaker stays open (0 while a probe is in flight).
type OpenError struct{ Left time.Duration }

func (e *OpenError) Error() string {
	if e.Left > 0 {
		return "circuit breaker open for another " + e.Left.Round(time.Millisecond).String()
	}
	return "circuit breaker open; a probe call is in flight"
}

// Is makes errors.Is(err, ErrOpen) true.
func (e *OpenError) Is(target error) bool { return target == ErrOpen }
