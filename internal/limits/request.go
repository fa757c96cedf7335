package limits

import (
	"fmt"
	"time"

	"github.com/sandgate/sandgate/internal/config"
)

// Counter lifetimes: a window's counter outlives its window a little, so that a late replica
// still sees it, and then vanishes by itself.
const (
	rpmTTL = 2 * time.Minute
	tokTTL = 48 * time.Hour
)

// request is one call resolved to its scopes: the sandbox's own counters, then (when the template
// sets a total) the template's shared counters.
type request struct {
	keys   Keys
	now    time.Time
	lease  time.Duration
	scopes []scope
}

type scope struct {
	limits                   config.LimitSet
	rpmKey, tokKey, leaseKey string
}

// limit names a limit that refused a call.
type limit int

const (
	limitNone limit = iota
	limitRequests
	limitTokens
	limitConcurrency
)

// result is what a store returns: the counters of each scope after the operation, and the first
// limit that refused it (limitNone when allowed) with the index of its scope.
type result struct {
	counts [maxScopes]counts // the first len(request.scopes) are the scopes'

	refused limit
	scope   int
}

type counts struct{ requests, tokens, concurrent int64 }

// maxScopes is the most scopes a request has: the sandbox's own, and its template's total.
const maxScopes = 2

// usageNames are the Usage keys of each scope's counters, in scope order.
var usageNames = [...][3]string{
	{UsageRequestsThisMinute, UsageTokensToday, UsageConcurrentToolCalls},
	{UsageTemplateRequestsThisMinute, UsageTemplateTokensToday, UsageTemplateConcurrentToolCalls},
}

func (r request) usage(res result) Usage {
	u := make(Usage, 3*len(r.scopes))
	for i := range r.scopes {
		c, names := res.counts[i], usageNames[i]
		u[names[0]], u[names[1]], u[names[2]] = c.requests, c.tokens, c.concurrent
	}
	return u
}

func (r request) verdict(res result) Verdict {
	if res.refused == limitNone {
		return allowed
	}
	s := r.scopes[res.scope]
	who := fmt.Sprintf("sandbox %s", r.keys.Sandbox)
	if r.keys.Template != "" {
		who += fmt.Sprintf(" (template %s)", r.keys.Template)
	}
	if res.scope > 0 {
		who = fmt.Sprintf("template %s (all its sandboxes together)", r.keys.Template)
	}
	switch res.refused {
	case limitRequests:
		return Verdict{
			Code:       CodeRateLimited,
			Reason:     fmt.Sprintf("rate limit of %d requests/minute for %s is reached", s.limits.RequestsPerMinute, who),
			RetryAfter: r.now.Truncate(time.Minute).Add(time.Minute).Sub(r.now),
		}
	case limitTokens:
		midnight := time.Date(r.now.Year(), r.now.Month(), r.now.Day()+1, 0, 0, 0, 0, time.UTC)
		return Verdict{
			Code:       CodeTokenBudgetSpent,
			Reason:     fmt.Sprintf("token budget of %d/day for %s is spent", s.limits.TokensPerDay, who),
			RetryAfter: midnight.Sub(r.now),
		}
	default:
		return Verdict{
			Code:   CodeConcurrency,
			Reason: fmt.Sprintf("limit of %d concurrent tool calls for %s is reached", s.limits.ConcurrentToolCalls, who),
		}
	}
}
