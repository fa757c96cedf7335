package audit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// DefaultLimit is the number of events Query returns when Filter.Limit is 0.
const DefaultLimit = 100

// Decision filter values.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
	// DecisionReportOnly selects the calls a report-only template's policy denied and let
	// through (Decision.WouldDeny set); they are also allowed calls.
	DecisionReportOnly = "report"
)

// Filter selects events. Empty fields match everything; set fields must all match.
type Filter struct {
	Namespace string
	// Sandbox is a sandbox's name, or NAMESPACE/NAME (the form the table prints), which sets
	// the namespace too.
	Sandbox  string
	Template string
	// Credential is the name of the credential the call injected.
	Credential string
	// Kind is an exact kind ("mcp.tools_call") or a family without a dot ("mcp", "http").
	Kind string
	// Decision is "", DecisionAllow or DecisionDeny.
	Decision string
	Tool     string
	// Host matches Target.Host case-insensitively; a Host without a port also matches the
	// target's host with any port.
	Host string
	// Since (inclusive) and Until (exclusive) bound the event time; zero means unbounded.
	Since, Until time.Time
	// Limit keeps the newest Limit matches: 0 means DefaultLimit, a negative value means all.
	Limit int
}

// Validate reports a filter that can never be meant, naming the field.
func (f Filter) Validate() error {
	var errs []error
	switch f.Decision {
	case "", DecisionAllow, DecisionDeny, DecisionReportOnly:
	default:
		errs = append(errs, fmt.Errorf("decision: %q is not allow, deny or report", f.Decision))
	}
	if ns, _, ok := strings.Cut(f.Sandbox, "/"); ok && f.Namespace != "" && ns != f.Namespace {
		errs = append(errs, fmt.Errorf("sandbox %q is in namespace %q, not %q", f.Sandbox, ns, f.Namespace))
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		errs = append(errs, fmt.Errorf("since (%s) must be before until (%s)",
			f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339)))
	}
	return errors.Join(errs...)
}

// Match reports whether ev passes the filter (Limit aside).
func (f Filter) Match(ev *Event) bool {
	id := &ev.Identity
	namespace, sandbox := f.Namespace, f.Sandbox
	if ns, name, ok := strings.Cut(sandbox, "/"); ok {
		namespace, sandbox = ns, name
	}
	switch {
	case namespace != "" && id.Namespace != namespace,
		sandbox != "" && id.Sandbox != sandbox,
		f.Template != "" && id.Template != f.Template,
		f.Credential != "" && ev.Credential != f.Credential,
		f.Decision == DecisionReportOnly && ev.Decision.WouldDeny == "",
		f.Kind != "" && !matchKind(string(ev.Kind), f.Kind),
		f.Decision == DecisionAllow && !ev.Decision.Allow,
		f.Decision == DecisionDeny && ev.Decision.Allow,
		f.Tool != "" && ev.Target.Tool != f.Tool,
		f.Host != "" && !matchHost(ev.Target.Host, f.Host),
		!f.Since.IsZero() && ev.Time.Before(f.Since),
		!f.Until.IsZero() && !ev.Time.Before(f.Until):
		return false
	}
	return true
}

func matchKind(kind, want string) bool {
	if strings.Contains(want, ".") {
		return kind == want
	}
	return strings.HasPrefix(kind, want+".")
}

func matchHost(host, want string) bool {
	if strings.EqualFold(host, want) {
		return true
	}
	if _, _, err := net.SplitHostPort(want); err == nil {
		return false // a port was asked for and did not match
	}
	h, _, err := net.SplitHostPort(host)
	return err == nil && strings.EqualFold(h, want)
}

// QueryResult holds the events Query selected.
type QueryResult struct {
	// Events are the newest Limit matches, oldest first.
	Events []Event
	// Matched counts all matches, including those the limit left out.
	Matched int
	// Malformed counts lines that could not be parsed and were skipped; Verify locates them.
	Malformed int
}

// Query reads the log in dir oldest to newest and returns the newest matches of f. It streams:
// memory holds at most Limit events, whatever the size of the log. Lines are parsed, not verified;
// run Verify to trust them. The writer's own records (KindChain, KindCheckpoint) are skipped.
func Query(ctx context.Context, dir string, f Filter) (*QueryResult, error) {
	limit := f.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	res := &QueryResult{}
	keep := newestN{limit: limit}
	malformed, err := Scan(ctx, dir, f, func(ev *Event) error {
		res.Matched++
		keep.add(*ev)
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Malformed = malformed
	res.Events = keep.inOrder()
	return res, nil
}

// Scan calls fn with every event of the log in dir that matches f (Limit aside), oldest first,
// and returns how many malformed lines it skipped. It streams, holding one event at a time;
// an error from fn stops it and is returned. The writer's own records are skipped.
func Scan(ctx context.Context, dir string, f Filter, fn func(*Event) error) (int, error) {
	if err := f.Validate(); err != nil {
		return 0, fmt.Errorf("query audit log: %w", err)
	}
	files, err := logFiles(dir)
	if err != nil {
		return 0, fmt.Errorf("query audit log: %w", err)
	}
	malformed := 0
	var stopped error // fn's error, returned as it is
	for _, path := range files {
		err := scanLines(path, func(n int, line []byte, lineErr error) error {
			if n%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if lineErr != nil {
				malformed++
				return nil
			}
			ev, err := ParseLine(line)
			if err != nil {
				malformed++
				return nil
			}
			if isRecordKind(ev.Kind) || !f.Match(&ev) {
				return nil // the writer's own records (chain, checkpoints) are not calls
			}
			stopped = fn(&ev)
			return stopped
		})
		if stopped != nil {
			return malformed, stopped
		}
		if err != nil {
			return malformed, fmt.Errorf("query audit log: %w", err)
		}
	}
	return malformed, nil
}

// newestN keeps the last limit events added (all of them when limit < 0) in a ring.
type newestN struct {
	limit int
	ring  []Event
	next  int // where the next event goes once the ring is full
}

func (k *newestN) add(ev Event) {
	if k.limit < 0 || len(k.ring) < k.limit {
		k.ring = append(k.ring, ev)
		return
	}
	k.ring[k.next] = ev
	k.next = (k.next + 1) % k.limit
}

func (k *newestN) inOrder() []Event {
	out := make([]Event, 0, len(k.ring))
	out = append(out, k.ring[k.next:]...)
	return append(out, k.ring[:k.next]...)
}

// ParseTimeFlag reads a --since/--until value: an RFC 3339 time, or a duration such as "90m" or
// "1h" meaning that long before now.
func ParseTimeFlag(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2025-01-31T15:04:05Z) nor a duration (90m, 1h)", s)
	}
	if d < 0 {
		return time.Time{}, fmt.Errorf("duration %q is negative; give how long ago, such as 1h", s)
	}
	return now.Add(-d), nil
}
