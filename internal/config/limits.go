package config

import (
	"fmt"
	"sort"
	"time"
)

// Failure modes of the limits store (Redis) when it cannot be reached in time.
const (
	FailClosed = "fail_closed"
	FailOpen   = "fail_open"
)

// Limits are the budgets and rate limits. Counters live in Redis when redis.addr is set (shared by
// all replicas), in memory otherwise. A zero or absent limit means unlimited.
type Limits struct {
	// FailureMode says what happens when the counters cannot be read or updated in time:
	// fail_closed (default: the call is denied, reason "rate limit store unavailable") or
	// fail_open (the call proceeds uncounted).
	FailureMode string `json:"failure_mode"`
	// ConcurrencyLease is how long a concurrent tool call holds its slot at most, so that slots of
	// a crashed replica come back. Default 10m; set it above the longest tool call.
	ConcurrencyLease Duration `json:"concurrency_lease"`
	// Default applies to each sandbox whose template has no entry in Templates (and to anonymous
	// callers, together).
	Default LimitSet `json:"default"`
	// Templates holds the limits by sandbox template name.
	Templates map[string]TemplateLimits `json:"templates"`
}

// LimitSet is one set of limits. Zero means unlimited.
type LimitSet struct {
	RequestsPerMinute   int64 `json:"requests_per_minute"`
	TokensPerDay        int64 `json:"tokens_per_day"`
	ConcurrentToolCalls int64 `json:"concurrent_tool_calls"`
}

// IsZero reports whether the set limits nothing.
func (l LimitSet) IsZero() bool { return l == LimitSet{} }

// TemplateLimits are the limits of one template: the inline fields apply to each sandbox of the
// template on its own, Total to all of its sandboxes together.
type TemplateLimits struct {
	LimitSet `json:",inline"`
	Total    LimitSet `json:"total"`
}

func (l *Limits) applyDefaults() {
	if l.FailureMode == "" {
		l.FailureMode = FailClosed
	}
	if l.ConcurrencyLease == 0 {
		l.ConcurrencyLease = Duration(10 * time.Minute)
	}
}

func (l *Limits) validate(errs *fieldErrors) {
	switch l.FailureMode {
	case FailClosed, FailOpen:
	default:
		errs.add("limits.failure_mode", "%q is not one of fail_closed, fail_open", l.FailureMode)
	}
	if l.ConcurrencyLease.D() < time.Second {
		errs.add("limits.concurrency_lease", "%s is shorter than 1s; it must outlast a tool call", l.ConcurrencyLease.D())
	}
	l.Default.validate("limits.default", errs)
	names := make([]string, 0, len(l.Templates))
	for name := range l.Templates {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		f := "limits.templates." + name
		if !validName(name) {
			errs.add(f, "template name %q may contain only letters, digits, '-', '_' and '.'", name)
		}
		t := l.Templates[name]
		t.LimitSet.validate(f, errs)
		t.Total.validate(f+".total", errs)
	}
}

func (s LimitSet) validate(prefix string, errs *fieldErrors) {
	for _, v := range []struct {
		name string
		n    int64
	}{
		{"requests_per_minute", s.RequestsPerMinute},
		{"tokens_per_day", s.TokensPerDay},
		{"concurrent_tool_calls", s.ConcurrentToolCalls},
	} {
		if v.n < 0 {
			errs.add(prefix+"."+v.name, "must not be negative, got %d (0 or absent means unlimited)", v.n)
		}
	}
}

// For returns the limits that apply to one sandbox of template (its own counters) and to all
// sandboxes of template together (the shared counters; zero when none are configured).
func (l Limits) For(template string) (perSandbox, total LimitSet) {
	if t, ok := l.Templates[template]; ok && template != "" {
		return t.LimitSet, t.Total
	}
	return l.Default, LimitSet{}
}

// String names the set's limits, for logs.
func (s LimitSet) String() string {
	return fmt.Sprintf("%d rpm, %d tokens/day, %d concurrent tool calls", s.RequestsPerMinute, s.TokensPerDay, s.ConcurrentToolCalls)
}
