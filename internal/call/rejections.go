package call

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// RejectionLimit bounds the events of protocol-level rejections (a foreign Origin, a malformed
// head, a session used from another address …): each source address gets PerWindow events per
// Window for noise, and as many again for the security-relevant codes (securityCodes), whose
// first rejection of each code per source and window is written whatever the budgets say. The
// rest are counted, by code, and written as one "suppressed" event when the source's window ends
// (or at Close). Sources beyond MaxSources share one overflow window.
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

// securityCodes are the rejections that tell of an attempt to be someone else or to reach what
// the caller may not: a session used from another address (a hijack), an address that is no
// sandbox (a forged or stale identity), a sandbox on the admin listener, a foreign Origin or
// Host (DNS rebinding), a head built to smuggle a request. A flood of noise never hides them.
var securityCodes = []string{CodeSessionNotOwned, CodeUnknownCaller, CodeAdminFromSandbox, CodeBadOrigin, CodeBadHost,
	CodeRequestSmuggling}

// securityCode is the index of code in securityCodes, or -1.
func securityCode(code string) int {
	for i, c := range securityCodes {
		if c == code {
			return i
		}
	}
	return -1
}

type rejections struct {
	mu       sync.Mutex
	lim      RejectionLimit
	now      func() time.Time
	sources  map[string]*rejectWindow
	overflow rejectWindow
}

type rejectWindow struct {
	start time.Time
	// written counts the noise events written in the window, security the security-relevant
	// ones; seen has bit i set once securityCodes[i] was written.
	written, security int
	seen              uint64
	suppressed        int64
	byCode            map[string]int64 // the suppressed rejections by code (a closed set)
	kind              audit.Kind
	id                identity.Identity
}

func newRejections(lim RejectionLimit) *rejections {
	return &rejections{lim: lim, now: time.Now, sources: map[string]*rejectWindow{}}
}

// Reject writes the one event of a request refused before it could be read as a call, and
// returns the refusal to answer with: r, or, when the audit log has no room for the event or
// cannot write it (a full disk), the fail-closed refusal audit_unavailable in its place (with
// r's Close), since nothing of a request is answered then but that refusal (docs/audit.md). kind
// is KindMCPRejected or KindHTTPRejected (or a call kind whose request was malformed); target
// says what is known of the request. Events are rate-limited per source address
// (RejectionLimit); suppressed ones are counted in a later event and in
// sandgate.rejections.suppressed.
func (c *Core) Reject(ctx context.Context, kind audit.Kind, id identity.Identity, target audit.Target, r *Refusal) *Refusal {
	pending, write := c.rejects.admit(kind, id, r.Code)
	for _, ev := range pending {
		c.writeSuppressed(ctx, ev)
	}
	if !write {
		c.metrics.suppressed.Add(ctx, 1)
		if c.opts.Audit.Healthy() != nil {
			return auditUnavailable(r)
		}
		return r
	}
	if c.opts.Audit.Healthy() != nil {
		r = auditUnavailable(r)
	}
	answered := Run(ctx, c, Spec{Kind: kind, Identity: id, Target: target}, Steps[*Refusal]{
		Ask:     func(context.Context, *Call) (Question, *Refusal) { return Question{}, r },
		Refused: func(answered *Refusal) *Refusal { return answered },
	})
	if answered != r && answered.Code == CodeAuditUnavailable { // no room for its event
		answered.Close = r.Close
	}
	return answered
}

// auditUnavailable is the refusal that answers a request in place of r while the audit log
// cannot take its event; the connection closes after it when it would have after r.
func auditUnavailable(r *Refusal) *Refusal {
	rf := Refuse(CodeAuditUnavailable, "audit log unavailable")
	rf.Close = r.Close
	return rf
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
			// The overflow window stands for many sources: it is never written as one of them.
			if rj.overflow.start.IsZero() {
				rj.overflow.start = now
			}
			return ended, rj.overflow.admit(kind, code, rj.lim.PerWindow)
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
	w.id = id
	return ended, w.admit(kind, code, rj.lim.PerWindow)
}

// admit counts one rejection of code in the window and reports whether its event is written:
// noise within the window's budget; a security-relevant code within its own budget, or as the
// first of its code in the window. Anything else is counted as suppressed.
func (w *rejectWindow) admit(kind audit.Kind, code string, budget int) bool {
	w.kind = kind
	if i := securityCode(code); i >= 0 {
		if first := w.seen&(1<<i) == 0; first || w.security < budget {
			w.seen |= 1 << i
			w.security++
			return true
		}
	} else if w.written < budget {
		w.written++
		return true
	}
	w.suppressed++
	if w.byCode == nil {
		w.byCode = map[string]int64{}
	}
	w.byCode[code]++
	return false
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
	if all || !rj.overflow.start.IsZero() && now.Sub(rj.overflow.start) >= rj.lim.Window {
		if rj.overflow.suppressed > 0 {
			ended = append(ended, rj.overflow)
		}
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
	src := "sources over the tracked limit"
	if w.id.SourceIP != "" {
		src = w.id.SourceIP
	}
	Run(ctx, c, Spec{Kind: w.kind, Identity: w.id}, Steps[struct{}]{
		Ask: func(context.Context, *Call) (Question, *Refusal) { return Question{}, nil },
		Act: func(_ context.Context, cl *Call, _ Grant) (struct{}, End) {
			cl.ev.Decision.Reason = fmt.Sprintf("%d more rejections from %s suppressed (%s)", w.suppressed, src, suppressedCodes(w.byCode))
			cl.ev.Outcome.Error = "suppressed"
			cl.decided = true
			return struct{}{}, End{how: endRecorded}
		},
		Refused: func(*Refusal) struct{} { return struct{}{} },
	})
}

// suppressedCodes lists the suppressed rejections by code, most first: "malformed_request 950,
// session_not_owned 3".
func suppressedCodes(byCode map[string]int64) string {
	codes := slices.Collect(maps.Keys(byCode))
	slices.SortFunc(codes, func(a, b string) int {
		if c := cmp.Compare(byCode[b], byCode[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%s %d", c, byCode[c])
	}
	return strings.Join(parts, ", ")
}
