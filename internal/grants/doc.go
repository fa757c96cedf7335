// Package grants keeps per-sandbox grants: named JSON values with a time to live that a dispatcher
// registers through the admin API (for example which repository's tools this session may use) and
// that the policy reads as input.grants.
//
// A Store is in memory for one process (NewMemory) or in Redis, shared by every replica
// (NewRedis). Grants expire by their TTL and vanish with their sandbox: whoever learns that a
// sandbox is gone (the Kubernetes identity watcher) calls DeleteSandbox.
//
// NewHandler serves the admin API. It belongs on the admin listener only, which sandboxes can
// never reach, and requires the admin bearer token on every request.
package grants
