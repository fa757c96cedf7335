// Package suggest works out least privilege for one sandbox template from what its sandboxes
// did: the smallest change to the policy data (data.yaml) that would have allowed what they
// were denied, and the entries they never used, each with its evidence, plus `opa test` cases
// for the change. It is `sandgate policy suggest`; nothing it computes is applied.
//
// The evidence is the decision log (every decision with its input) or the audit log (each
// event's input rebuilt as policy.InputFromEvent does). A template in report-only mode
// (enforce: false) is the usual source: its would-be denials were let through and recorded.
//
// The change is read as the shipped policies read data: templates.T.tools (per upstream, glob
// patterns as OPA's glob.match with "." as delimiter), hosts, ports and models (per provider,
// allow and max_tokens), and providers.P.hosts. Denials are read by their code: the shipped
// policies' tool_not_allowed, host_not_allowed, port_not_allowed, provider_not_allowed,
// model_not_allowed and max_tokens_exceeded are data changes; anything else (a grant, a
// missing target, a malformed request, Sandgate's own refusals) is listed as not one. The
// suggestion is then checked by evaluation: the policy folder with the change decides every
// denied call again (each must now be allowed, or it is listed as not lifted) and every allowed
// call (none may become denied, or the removals are withheld), and the generated tests pass.
package suggest
