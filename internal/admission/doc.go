// Package admission adds what the shared state knows about a caller to a call's policy input,
// for the gateway and the proxy alike: the call is counted against the caller's budgets and rate
// limits (limits.Limiter), its usage becomes input.usage and its grants input.grants
// (grants.Store). A call over a limit is refused before policy is asked, with the limiter's
// reason and code; the caller audits it like any other denial.
//
// A nil *Admission admits everything and adds nothing, so components built without shared state
// (tests, tools) need no special case.
package admission
