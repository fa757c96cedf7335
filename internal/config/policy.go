package config

import (
	"net/url"
	"strings"
	"time"
)

// Shadow configures a shadow policy: a candidate evaluated beside the enforced policy on every
// decided call, off the request path, that never changes an outcome (docs/policies.md).
type Shadow struct {
	// Dir holds the candidate's policy files, hot reloaded like policy.dir. Empty: no shadow.
	Dir string `json:"dir"`
	// QueueSize bounds the calls waiting for the shadow; a call that does not fit is not
	// shadowed (counted). Default 1024.
	QueueSize int `json:"queue_size"`
}

// Bundle loads the policies and data from an OPA bundle instead of policy.dir: exactly one of
// File, URL and OCI. Every bundle must carry a .signatures.json that verifies under
// PublicKeyFile; an unsigned or wrongly signed one is refused and the last good revision keeps
// serving.
type Bundle struct {
	// File is a bundle (.tar.gz) on disk, read again every poll interval.
	File string `json:"file"`
	// URL is a bundle served over HTTP(S) (an OPA bundle service), polled with ETags.
	URL string `json:"url"`
	// OCI is a registry reference, registry/repository:tag, pulled as OPA pulls bundles.
	OCI string `json:"oci"`
	// OCIPlainHTTP talks to the OCI registry over plain HTTP (a registry on loopback).
	OCIPlainHTTP bool `json:"oci_plain_http"`
	// PublicKeyFile is the PEM public key (or HMAC secret) that verifies the bundle. Required.
	PublicKeyFile string `json:"public_key_file"`
	// KeyID is the key's id in the signatures (opa build --signing-key ... sets "default").
	// Default "default".
	KeyID string `json:"key_id"`
	// Algorithm is the signing algorithm. Default RS256.
	Algorithm string `json:"algorithm"`
	// Scope, if set, must equal the signature's scope.
	Scope string `json:"scope"`
	// PollInterval is how often the bundle is looked at again. Default 60s.
	PollInterval Duration `json:"poll_interval"`
}

// DecisionLogHTTP configures policy.decision_log.http: gzip batches of OPA decision-log events
// POSTed to URL, with a bounded queue (drop and count) and retries with backoff.
type DecisionLogHTTP struct {
	// URL receives the batches, e.g. https://collector.example.com/logs. Empty: no upload.
	URL string `json:"url"`
	// MaxBatch is the most events per POST. Default 500.
	MaxBatch int `json:"max_batch"`
	// FlushInterval sends a partial batch this long after its first event. Default 5s.
	FlushInterval Duration `json:"flush_interval"`
	// QueueSize bounds the events waiting to be sent. Default 10000.
	QueueSize int `json:"queue_size"`
	// MaxRetries is how often a failed POST is retried before its batch is dropped. Default 5.
	MaxRetries int `json:"max_retries"`
}

func (h DecisionLogHTTP) validate(errs *fieldErrors) {
	if h.URL != "" {
		if u, err := url.Parse(h.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs.add("policy.decision_log.http.url", "%q is not an http(s) URL", h.URL)
		}
	}
	for _, f := range []struct {
		name string
		n    int
	}{{"max_batch", h.MaxBatch}, {"queue_size", h.QueueSize}, {"max_retries", h.MaxRetries}} {
		if f.n < 0 {
			errs.add("policy.decision_log.http."+f.name, "must be positive, got %d", f.n)
		}
	}
}

// Configured reports whether policy.bundle names a bundle.
func (b Bundle) Configured() bool { return b.File != "" || b.URL != "" || b.OCI != "" }

func (p *Policy) applyDefaults(c *Config) {
	if p.Dir == "" && !p.Bundle.Configured() {
		p.Dir = "policies"
	}
	if p.PollInterval == 0 {
		p.PollInterval = Duration(10 * time.Second)
	}
	p.Dir = c.Path(p.Dir)
	p.Shadow.Dir = c.Path(p.Shadow.Dir)
	if p.DecisionLog.File != "" {
		p.DecisionLog.File = c.Path(p.DecisionLog.File)
	}
	b := &p.Bundle
	if b.Configured() {
		b.File = c.Path(b.File)
		b.PublicKeyFile = c.Path(b.PublicKeyFile)
		if b.KeyID == "" {
			b.KeyID = "default"
		}
		if b.Algorithm == "" {
			b.Algorithm = "RS256"
		}
		if b.PollInterval == 0 {
			b.PollInterval = Duration(60 * time.Second)
		}
	}
}

func (p *Policy) validate(errs *fieldErrors) {
	if n := p.DecisionCacheEntries(); n < 0 {
		errs.add("policy.decision_cache", "must be 0 (off) or a number of entries, got %d", n)
	}
	p.DecisionLog.validate(errs)
	p.DecisionLog.HTTP.validate(errs)
	if p.Shadow.QueueSize < 0 {
		errs.add("policy.shadow.queue_size", "must be positive, got %d", p.Shadow.QueueSize)
	}
	if !p.Bundle.Configured() {
		return
	}
	if p.Dir != "" {
		errs.add("policy.bundle", "policy.dir and policy.bundle are mutually exclusive: remove one")
	}
	p.Bundle.validate(errs)
}

func (b Bundle) validate(errs *fieldErrors) {
	n := 0
	for _, s := range []string{b.File, b.URL, b.OCI} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		errs.add("policy.bundle", "set exactly one of file, url and oci")
	}
	if b.URL != "" {
		if u, err := url.Parse(b.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path == "" || u.Path == "/" {
			errs.add("policy.bundle.url", "%q is not an http(s) URL of a bundle, e.g. https://bundles.example.com/bundles/sandgate.tar.gz", b.URL)
		}
	}
	if b.OCI != "" {
		if reg, rest, ok := strings.Cut(b.OCI, "/"); !ok || reg == "" || rest == "" || strings.Contains(b.OCI, "://") {
			errs.add("policy.bundle.oci", "%q is not a reference registry/repository:tag, e.g. ghcr.io/acme/sandgate-policy:prod", b.OCI)
		}
	}
	if b.PublicKeyFile == "" {
		errs.add("policy.bundle.public_key_file", "is required: bundles must be signed (opa build --signing-key, docs/policies.md)")
	}
	if b.PollInterval.D() < time.Second {
		errs.add("policy.bundle.poll_interval", "must be at least 1s, got %s", b.PollInterval.D())
	}
}
