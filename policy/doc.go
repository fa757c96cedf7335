// Package policy decides every call with Rego (OPA v1).
//
// An Engine loads a folder of policies (*.rego, optional data *.json / *.yaml; *_test.rego are
// left to the test runner), compiles them once, prepares one query for data.sandgate.decision
// and evaluates it for each call with an input built directly as an AST value (no JSON
// round-trip). Every Decision carries the revision of the files it was made with.
//
// It fails closed: no policy, a policy that does not compile, an evaluation error (strict
// builtin errors included) or an undefined or malformed result is a deny whose reason says
// which. A reload that does not compile is rejected and the last good revision keeps serving.
package policy
