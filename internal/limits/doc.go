// Package limits enforces budgets and rate limits per sandbox and per template: requests per
// minute, model tokens per day and concurrent tool calls.
//
// A Limiter holds the limits (config.Limits) and a counter store: in memory for one process
// (NewMemory), or in Redis so that every replica enforces the same budget (NewRedis). Each
// operation is one atomic step in the store (one Lua script in Redis), so concurrent requests on
// any number of replicas never overshoot a limit between a check and an increment.
//
// # Windows
//
// Requests per minute use a fixed window per UTC minute (a burst of up to twice the limit across
// a minute boundary is possible; the count is exact and cheap). Tokens per day use the UTC
// calendar day. Window keys are named from the Limiter's clock, so replicas' clocks should agree
// to within a second or so. A request that is refused does not count.
//
// # Scopes
//
// The counters of each sandbox (keyed by identity.Identity.Key()) are checked against the limits of
// its template (or limits.default). A template may also set a total for all its sandboxes
// together; then both scopes are checked and counted in the same atomic step.
//
// # Redis trouble
//
// Every store call runs under a deadline (WithTimeout, default 250ms). When it fails the configured
// failure mode applies: fail_closed (the default) refuses with CodeStoreUnavailable, fail_open
// allows. The error is returned as well, for logs and metrics; the Verdict is always the one to
// act on. Concurrency slots are leases that expire (limits.concurrency_lease), so the slots of a
// crashed replica, or a release lost to an outage, come back by themselves.
package limits
