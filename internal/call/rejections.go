package call

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// RejectionLimit bounds the events of protocol-level rejections (a foreign Origin, a malformed
// head, a session used from another address …): each source address gets PerWindow events per
// Window; the rest are counted and written as one "suppressed" event when the source's window
// ends (or at Close). Sources beyond MaxSources share one overflow count.
type RejectionLimit struct {
	PerWindow  int
	Window     time.Duration
	MaxSources int
}

func (l RejectionLimit) withDefaults() RejectionLimit {
	if l.PerWindow <= 0 {
		l.PerWindow = 20
	}
	if l.Window <= 0 {
		l.Window = time.Second
	}
	if l.MaxSources <= 0 {
		l.MaxSources = 10000
	}
	return l
}

type rejections struct {
	mu       sync.Mutex
	lim      RejectionLimit
	now      func() time.Time
	sources  map[string]*rejectWindow
	overflow rejectWindow
}

type rejectWindow struct {
	start      time.Time
	written    int
	suppressed int64
	kind       audit.Kind
	id         identity.Identity
	lastCode   string
}

func newRejections(lim RejectionLimit) *rejections {
	return &rejections{lim: lim, now: time.Now, sources: map[string]*rejectWindow{}}
}

// Reject writes the one event of a request refused before it could be read as a call, and
// returns the status to answer with. kind is KindMCPRejected or KindHTTPRejected (or a call
// kind whose request was malformed); target says what is known of the request. Events are
// rate-limited per source address (RejectionLimit); suppressed ones are counted in a later
// event and in sandgate.rejections.suppressed.
func (c *Core) Reject(ctx context.Context, kind audit.Kind, id identity.Identity, target audit.Target, r *Refusal) int {
	status := r.Status()
	pending, write := c.rejects.admit(kind, id, r.Code)
	for _, ev := range pending {
		c.writeSuppressed(ctx, ev)
	}
	if !write {
		c.metrics.suppressed.Add(ctx, 1)
		return status
	}
	_, cl := c.Begin(ctx, kind, id)
	cl.Event.Target = target
	cl.Refuse(r)
	return status
}

// admit decides whether a rejection of id's source is written now; it returns the suppressed
// counts whose windows ended, to be written first.
func (rj *rejections) admit(kind audit.Kind, id identity.Identity, code string) (ended []rejectWindow, write bool) {
	rj.mu.Lock()
	defer rj.mu.Unlock()
	now := rj.now()
	w := rj.sources[id.SourceIP]
	if w == nil {
		if len(rj.sources) >= rj.lim.MaxSources {
			ended = rj.sweepLocked(now, false)
		}
		if len(rj.sources) >= rj.lim.MaxSources {
			rj.overflow.suppressed++
			rj.overflow.kind, rj.overflow.lastCode = kind, code
			return ended, false
		}
		w = &rejectWindow{start: now}
		rj.sources[id.SourceIP] = w
	}
	if now.Sub(w.start) >= rj.lim.Window {
		if w.suppressed > 0 {
			ended = append(ended, *w)
		}
		*w = rejectWindow{start: now}
	}
	w.kind, w.id, w.lastCode = kind, id, code
	if w.written < rj.lim.PerWindow {
		w.written++
		return ended, true
	}
	w.suppressed++
	return ended, false
}

// sweepLocked drops the windows that ended (all of them when all is set) and returns those
// with suppressed rejections, the overflow count included.
func (rj *rejections) sweepLocked(now time.Time, all bool) []rejectWindow {
	var ended []rejectWindow
	for addr, w := range rj.sources {
		if all || now.Sub(w.start) >= rj.lim.Window {
			if w.suppressed > 0 {
				ended = append(ended, *w)
			}
			delete(rj.sources, addr)
		}
	}
	if rj.overflow.suppressed > 0 {
		ended = append(ended, rj.overflow)
		rj.overflow = rejectWindow{}
	}
	return ended
}

// FlushRejections writes the suppressed counts of windows that ended (all of them when all
// is set, at shutdown). Serve calls it periodically so a count is never held for long.
func (c *Core) FlushRejections(ctx context.Context, all bool) {
	c.rejects.mu.Lock()
	ended := c.rejects.sweepLocked(c.rejects.now(), all)
	c.rejects.mu.Unlock()
	for _, w := range ended {
		c.writeSuppressed(ctx, w)
	}
}

func (c *Core) writeSuppressed(ctx context.Context, w rejectWindow) {
	_, cl := c.Begin(ctx, w.kind, w.id)
	src := "sources over the tracked limit"
	if w.id.SourceIP != "" {
		src = w.id.SourceIP
	}
	cl.Event.Decision.Reason = fmt.Sprintf("%d more rejections from %s suppressed (last code %s)", w.suppressed, src, w.lastCode)
	cl.Event.Outcome.Error = "suppressed"
	cl.Event.Outcome.Status = 0
	cl.decided = true
	cl.Finish()
}
