package config

import "time"

// Shutdown is what serve does on SIGTERM (docs/install.md, "Rollouts"): /readyz answers 503
// shutting_down at once while both listeners keep serving for Delay, so that the endpoints
// that still route to this replica learn it is going before its listeners close; then the
// listeners stop accepting and the calls in flight finish for up to Drain; what is left is
// cut, each cut call with its event (outcome error "shutdown"), and the audit log closes last.
// The chart's terminationGracePeriodSeconds covers Delay + Drain.
type Shutdown struct {
	// Delay keeps serving after SIGTERM with /readyz at 503. Default 5s; 0s stops accepting at once.
	Delay *Duration `json:"delay"`
	// Drain bounds how long the calls in flight may take to finish once the listeners stopped
	// accepting. Default 20s; 0s cuts them at once.
	Drain *Duration `json:"drain"`
}

// Defaults of Shutdown.
const (
	DefaultShutdownDelay = 5 * time.Second
	DefaultShutdownDrain = 20 * time.Second
)

// DelayD is shutdown.delay with its default applied.
func (s Shutdown) DelayD() time.Duration {
	if s.Delay == nil {
		return DefaultShutdownDelay
	}
	return s.Delay.D()
}

// DrainD is shutdown.drain with its default applied.
func (s Shutdown) DrainD() time.Duration {
	if s.Drain == nil {
		return DefaultShutdownDrain
	}
	return s.Drain.D()
}

// maxShutdown bounds delay and drain: Kubernetes waits terminationGracePeriodSeconds for both,
// and a rollout waits as long for every old pod.
const maxShutdown = 10 * time.Minute

func (s Shutdown) validate(errs *fieldErrors) {
	for _, f := range []struct {
		field string
		d     time.Duration
	}{{"shutdown.delay", s.DelayD()}, {"shutdown.drain", s.DrainD()}} {
		if f.d > maxShutdown {
			errs.add(f.field, "%s is longer than %s", f.d, maxShutdown)
		}
	}
}
