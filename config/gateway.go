package config

// Gateway configures the gateway side. Its fields arrive with the issue that builds that side.
type Gateway struct{}

func (x *Gateway) applyDefaults(c *Config) {}

func (x *Gateway) validate(c *Config, errs *fieldErrors) {}
