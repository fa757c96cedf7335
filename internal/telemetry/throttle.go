package telemetry

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Throttle lets one log line per key through each period and counts the others, so that an
// outage that fails every call writes a line per period, not a line per call. It is safe for
// concurrent use. Keys should be few (log messages), since each is remembered.
type Throttle struct {
	period time.Duration
	now    func() time.Time
	mu     sync.Mutex
	keys   map[string]*throttled
}

type throttled struct {
	last       time.Time
	suppressed int64
}

// NewThrottle returns a Throttle of one line per key and period; now may be nil (time.Now).
func NewThrottle(period time.Duration, now func() time.Time) *Throttle {
	if now == nil {
		now = time.Now
	}
	return &Throttle{period: period, now: now, keys: map[string]*throttled{}}
}

// Allow reports whether a line under key may be written now and, when it may, how many lines
// under key were held back since the last one written.
func (t *Throttle) Allow(key string) (ok bool, suppressed int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	k := t.keys[key]
	if k == nil {
		t.keys[key] = &throttled{last: now}
		return true, 0
	}
	if now.Sub(k.last) < t.period {
		k.suppressed++
		return false, 0
	}
	suppressed, k.suppressed, k.last = k.suppressed, 0, now
	return true, suppressed
}

// ThrottledHandler passes the records match selects through t, keyed by their message (a
// record let through after others were held back carries suppressed=N); other records pass
// as they are.
func ThrottledHandler(h slog.Handler, t *Throttle, match func(slog.Record) bool) slog.Handler {
	return &throttledHandler{next: h, t: t, match: match}
}

type throttledHandler struct {
	next  slog.Handler
	t     *Throttle
	match func(slog.Record) bool
}

func (h *throttledHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *throttledHandler) Handle(ctx context.Context, r slog.Record) error {
	if !h.match(r) {
		return h.next.Handle(ctx, r)
	}
	ok, suppressed := h.t.Allow(r.Message)
	if !ok {
		return nil
	}
	if suppressed > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int64("suppressed", suppressed))
	}
	return h.next.Handle(ctx, r)
}

func (h *throttledHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &throttledHandler{next: h.next.WithAttrs(as), t: h.t, match: h.match}
}

func (h *throttledHandler) WithGroup(name string) slog.Handler {
	return &throttledHandler{next: h.next.WithGroup(name), t: h.t, match: h.match}
}

// RecordHasError reports whether one of r's attributes is an error for which is returns true,
// for ThrottledHandler's match.
func RecordHasError(r slog.Record, is func(error) bool) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && is(err) {
			found = true
		}
		return !found
	})
	return found
}
