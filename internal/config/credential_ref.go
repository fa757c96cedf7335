package config

import "strings"

// CredentialRef says which credential Sandgate injects into a request and how: the one
// credential type of gateway upstreams, proxy routes and proxy hosts alike.
type CredentialRef struct {
	// Name is a credential defined in credentials.
	Name string `json:"name"`
	// Header is the request header that carries it (default Authorization).
	Header string `json:"header"`
	// Format is the header value with {value} standing for the secret, exactly once. Default
	// "Bearer {value}" for Authorization, "{value}" for any other header.
	Format string `json:"format"`
}

// Render is the header value for the secret v.
func (r *CredentialRef) Render(v string) string {
	if r.Format == "{value}" { // the default of every header but Authorization: no copy
		return v
	}
	return strings.Replace(r.Format, "{value}", v, 1)
}

func (r *CredentialRef) applyDefaults() {
	if r == nil {
		return
	}
	if r.Header == "" {
		r.Header = "Authorization"
	}
	if r.Format == "" {
		if strings.EqualFold(r.Header, "Authorization") {
			r.Format = "Bearer {value}"
		} else {
			r.Format = "{value}"
		}
	}
}

// validate is the one check of a credential reference; errors name field's members.
func (r *CredentialRef) validate(c *Config, field string, errs *fieldErrors) {
	if r == nil {
		return
	}
	if r.Name == "" {
		errs.add(field+".name", "must not be empty")
	} else if !c.HasCredential(r.Name) {
		errs.add(field+".name", "no credential named %q in credentials", r.Name)
	}
	if !headerToken(r.Header) {
		errs.add(field+".header", "%q is not an HTTP header name", r.Header)
	}
	switch strings.ToLower(r.Header) {
	case "host", "content-length", "transfer-encoding", "connection", "cookie", "te", "upgrade", "trailer":
		errs.add(field+".header", "%q cannot carry a credential", r.Header)
	}
	if strings.Count(r.Format, "{value}") != 1 {
		errs.add(field+".format", "%q must contain {value} exactly once", r.Format)
	}
	if strings.ContainsAny(r.Format, "\r\n\x00") {
		errs.add(field+".format", "must not contain a line break or NUL")
	}
}

// headerToken reports whether s is an HTTP field name (RFC 9110 token).
func headerToken(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return s != ""
}
