package config

// Proxy configures the proxy side. Its fields arrive with the issue that builds that side.
type Proxy struct{}

func (x *Proxy) applyDefaults(c *Config) {}

func (x *Proxy) validate(c *Config, errs *fieldErrors) {}
