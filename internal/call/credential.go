package call

// Credentials is where credential values come from (*credential.Store).
type Credentials interface {
	Get(name string) (string, bool)
}

// noCredentials holds no value.
type noCredentials struct{}

func (noCredentials) Get(string) (string, bool) { return "", false }

// takeCredential is the one credential step of both halves, after policy allowed the call:
// configured is the name of the credential the destination is configured with ("" none) and
// chosen the one policy's decision named ("" none). Only the configured credential can ever be
// injected: a policy naming another is refused (credential_not_configured, 403), and a
// configured credential without a value is refused rather than sent without it
// (credential_unavailable, 502). The call's event names the credential; the value is returned
// for the half to inject, and never kept.
func (cl *Call) takeCredential(configured, chosen string) (string, *Refusal) {
	if configured == "" {
		if chosen != "" {
			return "", Refuse(CodeCredentialNotConfigured, "policy chose credential %q but this destination has no credential configured", chosen)
		}
		return "", nil
	}
	if chosen != "" && chosen != configured {
		return "", Refuse(CodeCredentialNotConfigured, "policy chose credential %q but this destination is configured with %q", chosen, configured)
	}
	v, ok := cl.core.opts.Credentials.Get(configured)
	if !ok || v == "" {
		return "", Refuse(CodeCredentialUnavailable, "credential %q is not available", configured)
	}
	cl.UsesCredential(configured)
	return v, nil
}
